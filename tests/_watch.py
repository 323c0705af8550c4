"""A test's window into a session's training: a function run inside every step of every arm."""

from __future__ import annotations

import dataclasses


def watching(session, look):
    """``session``, whose arms call ``look(arm, seed, step, row)`` after every step, before the session's
    own per-step work (per-step file, live tracking); returns the session."""
    arm_hooks = session.arm_hooks

    def with_look(case_record, unit):
        hooks = arm_hooks(case_record, unit)
        if isinstance(hooks, dict):   # finished before the case was interrupted: not trained again
            return hooks
        own = hooks.on_step

        def on_step(step, row):
            look(unit.arm, unit.seed, step, row)
            own(step, row)
        return dataclasses.replace(hooks, on_step=on_step)

    session.arm_hooks = with_look
    return session
