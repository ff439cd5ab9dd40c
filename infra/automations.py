"""The automations that recover a lost worker (run by infra/deploy.sh; idempotent).

1. "specregen: crash zombie flow runs" (Prefect's "detect zombie flows" recipe): a flow run
   whose heartbeats stop for `SPECREGEN_ZOMBIE_AFTER_S` seconds (default 3 heartbeat periods,
   PREFECT_FLOWS_HEARTBEAT_FREQUENCY) without reaching a final state is marked Crashed: its
   process, or its machine, is gone.
2. "specregen: rerun crashed flow runs": a Crashed run of a specregen deployment (dataset/* or
   pipeline/*) is set back to Scheduled, as `prefect flow-run retry` does, so any worker of the
   pool runs it again under the same flow run id. The parent `pipeline` run waits for its child
   through that (flows/pipeline.py). The rerun skips what the crashed run finished (its outputs
   live in the storage root) and requests only what was in flight; a run that keeps crashing
   stops after MAX_RUNS attempts (flows/dataset.py fails it instead).

Prefect reads both from its server, so they act whichever worker or machine was lost.
"""

from __future__ import annotations

import os
from datetime import timedelta

from prefect.automations import Automation
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.settings import get_current_settings

ZOMBIE = "specregen: crash zombie flow runs"
RERUN = "specregen: rerun crashed flow runs"
FINAL = ["prefect.flow-run.Completed", "prefect.flow-run.Failed", "prefect.flow-run.Cancelled",
         "prefect.flow-run.Crashed"]
FLOWS = ["dataset", "pipeline"]  # flows/dataset.py, flows/pipeline.py


def zombie_automation(after_s: float) -> Automation:
    return Automation(
        name=ZOMBIE,
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *FINAL},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=after_s),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message="no heartbeat: its process or machine is gone")],
    )


def rerun_automation() -> Automation:
    return Automation(
        name=RERUN,
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            # Only runs of a deployment (a worker can pick them up) of specregen's flows.
            match_related=[
                ResourceSpecification({"prefect.resource.role": "flow",
                                       "prefect.resource.name": FLOWS}),
                ResourceSpecification({"prefect.resource.role": "deployment"}),
            ],
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(seconds=0),
        ),
        actions=[ChangeFlowRunState(state=StateType.SCHEDULED, force=True,
                                    message="rerun after a crash (lost worker)")],
    )


def main() -> None:
    period = get_current_settings().flows.heartbeat_frequency or 60
    after_s = float(os.environ.get("SPECREGEN_ZOMBIE_AFTER_S") or 3 * period)
    for automation in (zombie_automation(after_s), rerun_automation()):
        try:
            Automation.read(name=automation.name)
        except ValueError:  # not there yet
            automation.create()
            print(f"created the automation {automation.name!r}")


if __name__ == "__main__":
    main()
