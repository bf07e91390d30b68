"""Every step's figures (dgr/_scheduler.pxd, StepFigures) as the node's pump sees them,
for probes in process: importing this records them into `seen`."""

import dgr.loop

seen: list[dict] = []
_on_step_ended = dgr.loop.StepLoop._on_step_ended


def _recording(self, event, now):
    seen.append(dict(event.figures))
    _on_step_ended(self, event, now)


dgr.loop.StepLoop._on_step_ended = _recording
