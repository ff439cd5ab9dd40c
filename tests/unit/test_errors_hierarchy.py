"""One exception hierarchy: every exception class defined in `specregen` (and in the Prefect
`flows` and `tasks` that orchestrate it) is a `SpecregenError` (whose `exit_code` and `hint` the
CLI prints as one line), except the internal ones listed below, which never reach a user."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import flows
import specregen
import tasks
from specregen.errors import EXIT_INTERNAL, SpecregenError, UsageError

# Internal control flow: each is caught next to where it is raised and turned into something
# else, so its class never reaches a user (the reason says into what).
INTERNAL = {
    # -> the attempt's recorded `error_class` (retried like any failed attempt)
    "specregen.wire.stream.StreamError": "transport records it on the attempt",
    "specregen.wire.stream.StreamDecodeError": "transport records it on the attempt",
    # -> a quarantine reason `schema_invalid: ...` on the sample
    "specregen.gate.schema.SchemaInvalid": "the gate's schema check records it on the sample",
    # -> K2.5's template falls back to the JSON tool declaration, as upstream does
    "specregen.models.kimi_k25.tools_ts.ToolDeclarationError": "the JSON fallback",
    "specregen.models.kimi_k25.tools_ts._FieldError": "re-raised as ToolDeclarationError",
    # -> the sample's `error` (status "error"), or the probe observation's error
    "specregen.wire.response.ResponseError": "recorded on the sample / observation",
    # -> the emulated server's HTTP 400 body (what a real server answers a bad request with)
    "specregen.emulator.generate.RequestError": "the emulator's 400 answer",
    "specregen.models.qwen3.servers.RequestError": "the emulator's 400 answer",
    "specregen.models.kimi_k3.servers.RequestError": "the emulator's 400 answer",
    # -> re-raised as FormatError by KimiK3 (the encoder is standard library only: the real-vLLM
    # model folder carries it as its own file, so it cannot derive from specregen.errors)
    "specregen.models.kimi_k3.encoding.EncodingError": "re-raised as FormatError",
    # -> the restated SGLang stream parser's "nothing to complete yet" (upstream swallows it too)
    "specregen.models.serverkit.partial_json.PartialJSONError": "caught by the stream restatement",
}


def exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    infos = [info for package in (specregen, flows, tasks)
             for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    for info in infos:
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_user_facing_exception_is_a_specregen_error():
    classes = exception_classes()
    assert len(classes) > 20  # the walk saw the package, not an empty tree
    outside = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, SpecregenError) and name not in INTERNAL)
    assert outside == [], "derive these from specregen.errors (or list them as internal)"
    # The allow-list holds only classes that exist and really are outside the hierarchy.
    stale = sorted(name for name in INTERNAL
                   if name not in classes or issubclass(classes[name], SpecregenError))
    assert stale == []


def test_input_errors_exit_with_the_usage_code():
    classes = exception_classes()
    # Errors about a file or row the user gave: exit 2 with a message naming it.
    for name in ("specregen.cli.gate.GateInputError", "specregen.inspect.source.InspectError",
                 "specregen.store.token_samples.TokenFileError",
                 "specregen.export.published.PublicationError",
                 "specregen.report.stats.ReportError", "specregen.sources._common.RowError",
                 "specregen.models.chat_format.FormatError",
                 "specregen.models.registry.UnknownFormatError"):
        assert issubclass(classes[name], UsageError), name
    # No user-facing class keeps the "internal bug" exit code by accident. Known: the base;
    # ProbeFatalError and BatchAPIError set theirs per instance.
    per_instance = {"specregen.errors.SpecregenError", "specregen.probe.run.ProbeFatalError",
                    "specregen.client.batch_api.BatchAPIError"}
    default = sorted(name for name, cls in classes.items()
                     if issubclass(cls, SpecregenError) and cls.exit_code == EXIT_INTERNAL
                     and name not in per_instance)
    assert default == []


def test_outages_exit_with_the_unavailable_code():
    from flows.dataset import RerunLimitError
    from flows.demo import DemoError
    from flows.server import ServerStartError
    from specregen.client.limits import LimitStoreError
    from specregen.errors import EXIT_PARTIAL, EXIT_UNAVAILABLE

    assert LimitStoreError.exit_code == ServerStartError.exit_code == EXIT_UNAVAILABLE
    assert DemoError.exit_code == EXIT_UNAVAILABLE
    # A dataset that crashed past the rerun limit is a failed dataset among the others.
    assert RerunLimitError.exit_code == EXIT_PARTIAL
