"""A family is a plug-in: its package's descriptor (`models/<family>/family.py`, a `Family`) and
one line in the registry are all it takes (issue 22). A throwaway family, written to a temporary
folder and registered at test time the same way, is found by model id, its bundled tokenizer
loads by alias and is fingerprinted by its files, the emulator lists and serves its own profile,
the gate words its id rule, and a provider trait it declares (name, sentences, vote rule) is
found by the probe and read by its format -- with no edit anywhere else in specregen."""

from __future__ import annotations

import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from specregen.models import registry
from specregen.models.family import Family, IdServedSide, ProfileSpec, TextServedSide
from specregen.models.qwen3.family import MINI_QWEN3_TOKENIZER_DIR
from specregen.models.tokenizer import load_tokenizer

# A family that reuses Qwen3's code under its own name, tokenizer alias and emulator profile.
DESCRIPTOR = '''
import re
from pathlib import Path

from specregen.models.family import Family, profile_spec

HERE = Path(__file__).resolve().parent


def make_format(tokenizer, **options):
    from specregen.models.qwen3.format import make_format

    return make_format(tokenizer, **options)


def source_files():
    return (HERE / "family.py",)


def make_server(tokenizer):
    from specregen.models.qwen3.served import make_server

    return make_server(tokenizer)


FAMILY = Family(
    name="toy-lm",
    models=re.compile(r"(?:^|/)toy-lm", re.IGNORECASE),
    aliases=("toy",),
    thinking_switch="enable_thinking",
    make_format=make_format,
    source_files=source_files,
    bundled_tokenizers={"mini-toy": HERE / "mini_toy_tokenizer"},
    tokenizer_env="TOY_TOKENIZER_DIR",
    make_server=make_server,
    emulator_profiles=("vllm-toy", "openrouter"),
    profile_specs=(profile_spec("vllm-toy", "reasoning", role_content=True),),
    tool_id_rule="an id is not the toy's own",
)
'''


# The same family with probe rules of its own that bring a trait: whether the server returns
# the reasoning in capitals. Its format (Qwen3's, wrapped) notes what it was told.
PROBING_DESCRIPTOR = DESCRIPTOR.replace(
    'tool_id_rule="an id is not the toy\'s own",',
    'tool_id_rule="an id is not the toy\'s own",\n'
    '    reads_provider_traits=True,\n'
    '    make_probe_rules=lazy("toy_family_pkg.probe", "make_probe_rules"),',
).replace("import Family, profile_spec", "import Family, lazy, profile_spec").replace(
    "    return make_format(tokenizer, **options)",
    "    from toy_family_pkg.probe import ToyFormat\n\n"
    "    return ToyFormat(make_format(tokenizer, **options))")
PROBE = '''
from specregen.models.probe_rules import FamilyTrait, TraitVotes, vote
from specregen.models.qwen3.probe import Qwen3ProbeRules

SHOUTS = "shouts_reasoning"  # the toy's trait: its name is its own


def _shouting(votes: TraitVotes):
    loud = sum(1 for o in votes.answered if o.reasoning_chars > 100)
    quiet = sum(1 for o in votes.answered if 0 < o.reasoning_chars <= 100)
    return vote(loud, quiet, f"long reasoning {loud}, short {quiet}", "no reasoning")


class ToyProbeRules(Qwen3ProbeRules):
    traits = (FamilyTrait(SHOUTS, when_true="returns the reasoning in capitals",
                          when_false="returns the reasoning as written", vote=_shouting),)

    def history_call_id(self, name, index):
        return f"toy-{name}-{index}"


def make_probe_rules():
    return ToyProbeRules()


class ToyFormat:
    """Qwen3's format under the toy's name, noting the toy's trait it was given."""

    told: list = []

    def __init__(self, inner):
        self._inner = inner
        self.name = "toy-lm"

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def readings(self, request, completion, calls, thinking, truncated, history, traits):
        ToyFormat.told.append(traits.get(SHOUTS))
        return self._inner.readings(request, completion, calls, thinking, truncated, history,
                                    traits)
'''


def _install(tmp_path, monkeypatch, descriptor: str, **modules: str) -> Family:
    package = tmp_path / "toy_family_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "family.py").write_text(textwrap.dedent(descriptor))
    for name, text in modules.items():
        (package / f"{name}.py").write_text(textwrap.dedent(text))
    shutil.copytree(MINI_QWEN3_TOKENIZER_DIR, package / "mini_toy_tokenizer")
    monkeypatch.syspath_prepend(str(tmp_path))
    # The one line a family adds to the registry.
    monkeypatch.setattr(registry, "FAMILY_MODULES",
                        (*registry.FAMILY_MODULES, "toy_family_pkg.family"))
    return registry.family("toy-lm")


def _uninstall() -> None:
    for name in [m for m in sys.modules if m.startswith("toy_family_pkg")]:
        del sys.modules[name]
    registry._loaded.pop("toy_family_pkg.family", None)


@pytest.fixture
def toy(tmp_path, monkeypatch) -> Family:
    yield _install(tmp_path, monkeypatch, DESCRIPTOR)
    _uninstall()


@pytest.fixture
def probing_toy(tmp_path, monkeypatch) -> Family:
    yield _install(tmp_path, monkeypatch, PROBING_DESCRIPTOR, probe=PROBE)
    _uninstall()


def test_the_registry_finds_the_family_through_its_descriptor(toy):
    assert registry.format_for_model("acme/Toy-LM-7B") == "toy-lm"
    assert registry.canonical_name("toy") == "toy-lm"
    assert "toy-lm" in registry.format_names()
    assert registry.thinking_switch("toy-lm") == "enable_thinking"
    assert registry.tokenizer_env("toy-lm") == "TOY_TOKENIZER_DIR"
    assert registry.bundled_tokenizer("toy-lm") == "mini-toy"
    assert registry.probe_rules("toy-lm") is None and not registry.reads_provider_traits("toy-lm")
    assert registry.real_vllm_spec("toy-lm") is None and registry.fidelity_corpus("toy-lm") is None
    assert [p.name for p in registry.format_source_files("toy-lm")] == ["family.py"]
    tok = load_tokenizer("mini-toy")
    assert registry.get_format("toy", tok).encode_prompt([{"role": "user", "content": "hi"}])


def test_its_bundled_tokenizer_loads_by_alias_and_is_fingerprinted_by_its_files(toy):
    from specregen.pipeline.layout import tokenizer_fingerprint
    from specregen.store.manifest import fingerprint

    tok = load_tokenizer("mini-toy")
    assert tok.added_tokens == load_tokenizer("mini-qwen3").added_tokens
    before = tokenizer_fingerprint("mini-toy")
    assert before != fingerprint("hub", "mini-toy")
    config = toy.bundled_tokenizers["mini-toy"] / "tokenizer_config.json"
    config.write_text(config.read_text() + "\n")
    assert tokenizer_fingerprint("mini-toy") != before


def test_the_emulator_lists_and_serves_its_profile(toy):
    from specregen.emulator.app import EmulatorState
    from specregen.emulator.config import EmulatorConfig, all_profiles
    from specregen.emulator.profiles import PROFILE_SPECS
    from specregen.emulator.served import served_reply

    assert "vllm-toy" in all_profiles() and "vllm-toy" in PROFILE_SPECS
    assert isinstance(PROFILE_SPECS["vllm-toy"], ProfileSpec)
    config = EmulatorConfig(profile="vllm-toy", model="acme/toy-lm")
    state = EmulatorState(config, load_tokenizer("mini-toy"))
    assert isinstance(state.server, TextServedSide) and not isinstance(state.server, IdServedSide)
    assert state.spec.name == "vllm-toy" and state.spec.role_content
    request = {"model": "acme/toy-lm", "messages": [{"role": "user", "content": "hi"}]}
    message, view, gen = served_reply(state.server, config, request, b"k" * 32, None)
    assert view.ids and gen.prompt_ids and message.finish_reason == "stop"
    with pytest.raises(ValueError, match="served with the profiles vllm-toy, openrouter"):
        EmulatorState(EmulatorConfig(profile="moonshot", model="acme/toy-lm"),
                      load_tokenizer("mini-toy"))


def test_the_gate_words_the_family_id_rule(toy):
    from specregen.gate.config import GateConfig
    from specregen.gate.report import run_gate

    fmt = registry.get_format("toy-lm", load_tokenizer("mini-toy"))
    fmt.name = "toy-lm"  # Qwen3's code under the toy's name
    report = run_gate([], fmt, GateConfig(), dataset="toy")
    assert report.tool_id_rule == "an id is not the toy's own"
    assert "tool_id_rule" not in report.to_dict()


def test_every_family_declares_what_its_format_says():
    tok = {"kimi-k2.5": "mini", "qwen3": "mini-qwen3", "kimi-k3": "mini-k3"}
    for fam in registry.families():
        fmt = registry.get_format(fam.name, load_tokenizer(tok[fam.name]))
        assert fmt.thinking_switch == fam.thinking_switch, fam.name
        assert fam.bundled_tokenizer == tok[fam.name]
        assert all(re.fullmatch(r"[\w.-]+", p) for p in fam.emulator_profiles)
        server = registry.get_server(fam.name, fmt.tok)
        assert isinstance(server, IdServedSide | TextServedSide), fam.name
        if fam.name in ("qwen3", "kimi-k3"):  # the folder is also named by its tokens.py
            from specregen.models.kimi_k3.tokens import MINI_K3_TOKENIZER_DIR
            from specregen.models.qwen3.tokens import MINI_QWEN3_TOKENIZER_DIR as qwen3_dir

            folder = qwen3_dir if fam.name == "qwen3" else MINI_K3_TOKENIZER_DIR
            assert fam.bundled_tokenizers[tok[fam.name]] == folder
        if fam.make_probe_rules is not None:
            assert registry.probe_rules(fam.name) is not None


def test_no_family_name_is_spelled_outside_its_package():
    # The profile names and tokenizer aliases families declare are theirs alone: code outside
    # the family's package (docstrings and help examples aside) does not spell them. The
    # fidelity corpora (emulator code that serves a family's answers) are named by its
    # descriptor and may.
    root = Path(registry.__file__).resolve().parents[1]
    names = [f'"{p.name}"' for fam in registry.families() for p in fam.profile_specs]
    names += [f'"{alias}"' for fam in registry.families() for alias in fam.bundled_tokenizers
              if alias != "mini"]
    corpora = {fam.fidelity_corpus for fam in registry.families() if fam.fidelity_corpus}
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        package = ".".join(module.split(".")[:3])
        if module in corpora or any(package == m.rsplit(".", 1)[0]
                                    for m in registry.FAMILY_MODULES):
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{module}: {n}" for n in names if n in text]
    assert not found, found


def test_a_trait_the_family_declares_is_probed_and_reaches_its_format(probing_toy, tmp_path):
    from specregen.client.config import EndpointConfig
    from specregen.models.probe_answer import Observation
    from specregen.probe.classify import summarize
    from specregen.probe.model import ScenarioResult, load_profile, save_profile
    from specregen.probe.run import build_profile
    from specregen.probe.scenarios import build_scenarios, rules_of
    from specregen.reconstruct import reconstruct

    rules = rules_of("toy-lm")
    history = next(s for s in build_scenarios(1, rules=rules) if s.name == "history")
    calls = [c for m in history.prompts[0].messages for c in m.get("tool_calls") or []]
    assert [c["id"] for c in calls] == ["toy-get_weather-0", "toy-get_weather-1"]

    answers = [Observation(index=i, ok=True, calls_where="none", reasoning_chars=500)
               for i in range(2)]
    scenario = summarize(ScenarioResult("plain", "", "tools", False, None), answers)
    cfg = EndpointConfig(base_url="http://127.0.0.1:9/v1", model="acme/toy-lm")
    profile = build_profile(cfg, [scenario], tool_mode="tools", requests=2)
    assert profile.findings.family == {"shouts_reasoning": True}
    assert profile.findings.evidence["shouts_reasoning"] == "long reasoning 2, short 0"
    assert ("shouts_reasoning: returns the reasoning in capitals (long reasoning 2, short 0)"
            in profile.notes)
    stored = json.loads(profile.to_json())["findings"]
    assert stored["shouts_reasoning"] is True
    traits = load_profile(save_profile(profile, tmp_path / "p.json")).traits()
    assert traits.get("shouts_reasoning") is True
    assert traits.to_dict()["shouts_reasoning"] is True

    fmt = registry.get_format("toy-lm", load_tokenizer("mini-toy"))
    request = {"model": "acme/toy-lm", "messages": [{"role": "user", "content": "hi"}]}
    response = {"choices": [{"message": {"role": "assistant", "content": "hello"},
                             "finish_reason": "stop"}], "usage": {}}
    told = type(fmt).told
    told.clear()
    reconstruct("s", request, response, fmt, traits=traits)
    assert told == [True]
