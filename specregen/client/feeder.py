"""The conversation feeder: the requests of whole conversations, one after another.

A prompt with `turns == "all"` is a whole conversation (specregen/conversation): every request
is one sample (`{cid}/t{k}/s{j}`, its record carries `conversation`). The engine asks the feeder
for a conversation's first request (`start`), and for the next one once the previous answer's
final record is durable (`answered`; never earlier, so a crash cannot leave a paid request built
on an answer the log lost). A rerun walks each conversation over the final records already in
the log (same bodies, hence same fingerprints: client/driver.py) and pays only from its first
request without one; those answers count as skipped. A later request that fails
`followup_check` (it outgrew the context) is not sent: a final record (error_class
`context_length`, nothing paid) stops its conversation with `length`, reruns included.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from specregen.client.config import EndpointConfig
from specregen.client.driver import ConversationDriver, ConversationState, Step, history_format
from specregen.client.recording import RecordWriter, refusal_record
from specregen.client.scheduler import Job
from specregen.client.secrets import ApiKey
from specregen.client.summary import InferenceSummary
from specregen.conversation.plan import ConversationError
from specregen.models.chat_format import ChatFormat
from specregen.records import Prompt
from specregen.store.rawlog import FINAL_ANSWER, LogHistory

log = logging.getLogger(__name__)

Check = Callable[[Prompt, dict[str, Any]], str | None]


class ConversationFeeder:
    """A run's whole conversations. `chat_format` turns the model's answers into history
    messages (None: the endpoint's format, loaded when the first conversation starts);
    `prompt_check` checks a conversation's first request, `followup_check` the later ones;
    `reject(sample_id, reason)` refuses a request that cannot be sent."""

    def __init__(
        self,
        cfg: EndpointConfig,
        history: LogHistory,
        summary: InferenceSummary,
        writer: RecordWriter,
        reject: Callable[[str | None, str], None],
        *,
        key: ApiKey | None,
        retry_failed: bool,
        chat_format: ChatFormat | None,
        prompt_check: Check | None,
        followup_check: Check | None,
    ) -> None:
        self.cfg = cfg
        self.history = history
        self.summary = summary
        self.writer = writer
        self.reject = reject
        self.key = key
        self.retry_failed = retry_failed
        self.chat_format = chat_format
        self.prompt_check = prompt_check
        self.followup_check = followup_check
        self.answers = 0  # final answers to conversations' requests in this run
        self._driver: ConversationDriver | None = None

    @property
    def driver(self) -> ConversationDriver:
        if self._driver is None:
            fmt = self.chat_format or history_format(self.cfg.format_name)
            self._driver = ConversationDriver(self.cfg, fmt, self.history.conversation_finals,
                                              retry_failed=self.retry_failed)
        return self._driver

    # What the run's summary and progress read (nothing before the first conversation).

    @property
    def replayed(self) -> int:
        return self._driver.replayed if self._driver else 0

    @property
    def stops(self) -> Counter[str]:
        return self._driver.stops if self._driver else Counter()

    @property
    def open(self) -> int:
        return self._driver.open if self._driver else 0

    @property
    def started(self) -> bool:
        return self._driver is not None

    def start(self, prompt: Prompt) -> Job | None:
        """The conversation's first request to send (None: over already, or rejected)."""
        driver = self.driver
        try:
            state = driver.start(prompt)
        except ConversationError as exc:
            self.reject(prompt.sample_id, exc.detail)
            return None
        self.summary.conversations += 1
        return self._next_job(driver, state)

    def answered(self, job: Job, status: str, response: dict[str, Any] | None) -> Job | None:
        """The request's final record (`status`, `response`) is durable: the conversation's
        next request, or None when it is over."""
        assert job.step is not None
        if status in FINAL_ANSWER:
            self.answers += 1
        driver = self.driver
        driver.answered(job.step, status, response)
        return self._next_job(driver, job.step.state)

    def abandon(self, jobs: Iterable[Job]) -> None:
        """These jobs will not be sent (the run stopped): their conversations stay open."""
        count = sum(1 for job in jobs if job.step is not None)
        if count:
            self.driver.abandoned(count)

    @staticmethod
    def planned_requests(job: Job) -> int:
        """Requests the conversation's dataset path still holds (the model may stop sooner)."""
        assert job.step is not None
        plan, request = job.step.state.plan, job.step.request
        turns = plan.turns[request.user_turn:]
        return sum(max(1, len(t.steps)) for t in turns) - request.step

    def _next_job(self, driver: ConversationDriver, state: ConversationState) -> Job | None:
        """The conversation's next request as a job (answers already in the log are taken
        from it, not paid for again), or None when it is over."""
        replayed = driver.replayed
        try:
            step = driver.next_step(state)
        except (ValueError, TypeError, RecursionError) as exc:
            self.reject(state.conversation_id, f"cannot be sent as JSON: {exc}")
            driver.abandoned()
            return None
        finally:
            # Answers taken from the log count as skipped as they are taken.
            self.summary.skipped += driver.replayed - replayed
        if not isinstance(step, Step):
            return None
        # The first request is the prompt's own (checked like any prompt); later ones grew.
        check = self.prompt_check if not state.answers else self.followup_check
        if check is not None:
            reason = check(step.prompt, step.body)
            if reason is not None and state.answers:
                return self._outgrown(driver, step, reason)
            if reason is not None:
                self.reject(step.prompt.sample_id, reason)
                driver.abandoned()
                return None
        key = (step.prompt.sample_id, step.fingerprint)
        return Job(step.prompt, step.body, step.fingerprint,
                   attempt=self.history.last_attempt.get(key, 0) + 1,
                   tries=self.history.open_attempts.get(key, 0), step=step)

    def _outgrown(self, driver: ConversationDriver, step: Step, reason: str) -> Job | None:
        """A later request of a conversation no longer fits the context: not sent; its final
        record (nothing paid) stops the conversation with `length` in this run, every rerun
        and the samples alike (`--retry-failed` checks it again)."""
        fields = driver.outgrown(step, reason)
        key = (step.prompt.sample_id, step.fingerprint)
        record = refusal_record(step, self.history.last_attempt.get(key, 0) + 1,
                                fields["error_class"], reason, self.key)
        log.info("conversation %s stops (length) at %s: %s", step.state.conversation_id,
                 step.prompt.sample_id, reason)
        # Not counted as a failed sample; only a write failure matters here.
        if self.writer.submit(record, self.writer.outcome) is None:
            driver.abandoned()  # not recorded: a rerun checks it again
            return None
        return self._next_job(driver, step.state)  # the stop: None
