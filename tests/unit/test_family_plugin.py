"""A family is a plug-in: its package's descriptor (`models/<family>/family.py`, a `Family`) and
one line in the registry are all it takes (issue 22). A throwaway family, written to a temporary
folder and registered at test time the same way, is found by model id, its bundled tokenizer
loads by alias and is fingerprinted by its files, the emulator lists and serves its own profile,
the gate words its id rule, and a provider trait it declares (name, sentences, vote rule) is
found by the probe and read by its format -- with no edit anywhere else in specregen."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specregen.models import registry
from specregen.models.family import Family, IdServedSide, ProfileSpec, TextServedSide
from specregen.models.qwen3.family import MINI_QWEN3_TOKENIZER_DIR
from specregen.models.tokenizer import MINI_TOKENIZER_DIR, load_tokenizer

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
    for module, fam in zip(registry.FAMILY_MODULES, registry.families(), strict=True):
        fmt = registry.get_format(fam.name, load_tokenizer(tok[fam.name]))
        assert fmt.thinking_switch == fam.thinking_switch, fam.name
        assert fam.bundled_tokenizer == tok[fam.name]
        assert all(re.fullmatch(r"[\w.-]+", p) for p in fam.emulator_profiles)
        server = registry.get_server(fam.name, fmt.tok)
        assert isinstance(server, IdServedSide | TextServedSide), fam.name
        # A family's bundled tokenizers live in its own package (they ship with it); `mini`,
        # the project's base ranks that K2.5 and K3's mini share, is the one outside.
        package = Path(sys.modules[module].__file__ or "").parent
        for folder in set(fam.bundled_tokenizers.values()) - {MINI_TOKENIZER_DIR}:
            assert folder.is_dir() and folder.is_relative_to(package), (fam.name, folder)
        if fam.make_probe_rules is not None:
            assert registry.probe_rules(fam.name) is not None


def test_no_family_name_is_spelled_outside_its_package():
    # The profile names and tokenizer aliases families declare are theirs alone: code outside
    # the family's package (docstrings and help examples aside) does not spell them; their
    # fidelity corpora are in their packages too.
    root = Path(registry.__file__).resolve().parents[1]
    names = [f'"{p.name}"' for fam in registry.families() for p in fam.profile_specs]
    names += [f'"{alias}"' for fam in registry.families() for alias in fam.bundled_tokenizers
              if alias != "mini"]
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        package = ".".join(module.split(".")[:3])
        if any(package == m.rsplit(".", 1)[0] for m in registry.FAMILY_MODULES):
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{module}: {n}" for n in names if n in text]
    assert not found, found


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_no_marker_is_spelled_outside_the_models():
    # A model's marker strings (every registered family's format's `markers`: its structural
    # tokens and the literals it flags) are model-specific knowledge: outside specregen/models/
    # no string in code holds one (comments and docstrings may name them). The checkout's
    # Prefect side and benches count too; the tests and the scripts that build the bundled
    # tokenizers spell them on purpose.
    markers: set[str] = set()
    for fam in registry.families():
        alias = fam.bundled_tokenizer
        assert alias is not None, fam.name
        found = registry.get_format(fam.name, load_tokenizer(alias)).markers
        markers.update(found.names(), found.literals)
    assert "<|im_end|>" in markers and "<|end_of_msg|>" in markers
    root = Path(registry.__file__).resolve().parents[2]
    paths = [p for top in ("specregen", "flows", "tasks", "deployments", "bench")
             for p in sorted((root / top).rglob("*.py"))]
    hits = []
    for path in paths:
        name = path.relative_to(root).as_posix()
        if name.startswith("specregen/models/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docs):
                hits += [f"{name}:{node.lineno}: {m}" for m in sorted(markers) if m in node.value]
    assert not hits, hits


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


def test_kimi_k3_is_its_package_plus_one_registry_line(tmp_path):
    """Issue 22's proof, run: the library without `models/kimi_k3/` and without its registry
    line still imports every module and serves the other families. K3 is one package plus one
    line, whatever later changes bring."""
    root = Path(registry.__file__).resolve().parents[2]
    line = '    "specregen.models.kimi_k3.family",\n'
    copy = tmp_path / "specregen"
    shutil.copytree(root / "specregen", copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(copy / "models" / "kimi_k3")
    registry_py = copy / "models" / "registry.py"
    text = registry_py.read_text(encoding="utf-8")
    assert text.count(line) == 1
    registry_py.write_text(text.replace(line, ""), encoding="utf-8")
    outside = []  # code (imports, strings) naming K3's modules; comments and docstrings may
    for path in copy.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [node.value] if isinstance(node, ast.Constant)
                     and isinstance(node.value, str) and id(node) not in docs else [])
            outside += [f"{path.relative_to(copy)}:{node.lineno}" for n in names
                        if "kimi_k3" in n]
    assert not outside, f"K3 named outside its package: {outside}"
    script = textwrap.dedent("""
        import importlib, pkgutil, specregen
        assert specregen.__file__.startswith(%r), specregen.__file__
        broken = []
        for info in pkgutil.walk_packages(specregen.__path__, "specregen."):
            try:
                importlib.import_module(info.name)
            except Exception as exc:
                broken.append(f"{info.name}: {exc!r}")
        assert not broken, broken
        from specregen.models import registry
        from specregen.models.tokenizer import load_tokenizer
        assert registry.format_names() == ["kimi-k2.5", "qwen3"], registry.format_names()
        for name, tok in (("kimi-k2.5", "mini"), ("qwen3", "mini-qwen3")):
            fmt = registry.get_format(name, load_tokenizer(tok))
            ids = fmt.encode_prompt([{"role": "user", "content": "hi"}], None)
            assert ids, name
        print("ok")
    """) % str(copy)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
