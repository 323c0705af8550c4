"""Training one arm (one model, one seed) with the probes attached: config in, arm record out.

    trainer.py      setup, the loop over steps, ``ArmHooks`` (the one callback channel)
    step.py         one training step, returning its row of figures
    state.py        what carries over from one step to the next
    monitor.py      spikes and divergence
    reducer.py      one process or a torchrun process group, behind one interface
    faults.py       deliberate faults (NaN / Inf activations, an LR spike, a killed process) as hooks
    evaluate.py, optimizer.py, schedules (in stability.config.schedules)
    probes.py       the figure computations and the registry of per-layer heavy probes
    quantize.py     post-training quantization and its registry of schemes
    extrapolation.py, checkpoint.py, replay.py, distributed.py
"""
