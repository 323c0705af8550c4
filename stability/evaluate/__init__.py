"""Evaluations of a trained model, after training: each arm's model under post-training quantization
(``quantize.py``, the registry of schemes ``SCHEMES``) and at longer contexts than it trained on
(``extrapolation.py``). They read the trained model and the corpus and add to the arm's record through the
record's builders; the held-out loss measured while training is the trainer's (``stability.train.evaluate``).
"""
