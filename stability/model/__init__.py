"""The model an arm trains.

    lm.py           the harness's decoder LM (families llama and gpt2)
    attention.py    attention with every gate variant of Qiu et al. (G1-G5 ...), three backends
    build.py        an arm's model, whoever wrote it: the harness, Hugging Face, or a ``model.factory``
    hf.py, inject.py  Hugging Face causal LMs and the G1 gate injected into them
    rounding.py     rounding replicates: a run's initial parameters moved by one rounding step
"""
