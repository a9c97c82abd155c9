"""The vllm backend (`VllmSampler`) run on CPU against a stub of vLLM's public offline API: a `vllm` package written
to a tmp dir (so `importlib.util.find_spec("vllm")` finds it) whose `LLM.generate` samples with the snapshot's real
model (bfloat16, like an engine), the adapter loaded from the published peft folder, one torch generator per request
seeded from `SamplingParams.seed`. The stub checks argument names and values as vLLM does and records every call.

Checked against (vLLM's public API, versions 0.9-0.11+):
- `vllm.LLM(model, *, seed, gpu_memory_utilization, enable_lora, max_lora_rank, logprobs_mode, **EngineArgs)`:
  vllm-project/vllm vllm/entrypoints/llm.py; EngineArgs.logprobs_mode (default "raw_logprobs") in
  vllm/engine/arg_utils.py; max_lora_rank in (1, 8, 16, 32, 64, 128, 256, 320, 512): vllm/config LoRAConfig.
- `LLM.generate(prompts, /, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None)`: one
  SamplingParams or one per prompt (lengths must match), one LoRARequest or one per prompt.
- `vllm.SamplingParams(n, temperature, top_p, max_tokens, seed, logprobs, stop_token_ids, ...)`:
  https://docs.vllm.ai/en/v0.8.3/api/inference_params.html, https://docs.vllm.ai/en/v0.15.0/api/vllm/sampling_params/
- `vllm.inputs.TokensPrompt(prompt_token_ids=...)` (a TypedDict): vllm/entrypoints/llm.py imports.
- `vllm.lora.request.LoRARequest(lora_name, lora_int_id, lora_path)`, id > 0, equality by name:
  https://docs.vllm.ai/en/v0.14.0/api/vllm/lora/request/
- `RequestOutput.outputs[i].token_ids` (stop token included), `.logprobs`: list of dict[int, Logprob(logprob, rank,
  decoded_token)], the sampled token always present (logprobs=0: only it): vllm/v1/engine/logprobs.py,
  https://docs.vllm.ai/en/v0.20.0/api/vllm/v1/sample/sampler/
- batch invariance: env `VLLM_BATCH_INVARIANT=1`: https://docs.vllm.ai/en/stable/features/batch_invariance/
"""

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

TIMING = {"t_gen", "t_step"}

STUB = {
    "__init__.py": """
        from vllm.entrypoints.llm import LLM
        from vllm.inputs import TokensPrompt
        from vllm.logprobs import Logprob
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.sampling_params import SamplingParams

        CALLS = []  # ("LLM", kwargs, env) and ("generate", prompts, params, lora_request, use_tqdm)
    """,
    "inputs/__init__.py": """
        from typing import NotRequired, TypedDict

        class TokensPrompt(TypedDict):
            prompt_token_ids: list[int]
            cache_salt: NotRequired[str]
    """,
    "logprobs.py": """
        from dataclasses import dataclass

        @dataclass
        class Logprob:
            logprob: float
            rank: int | None = None
            decoded_token: str | None = None
    """,
    "sequence.py": "from vllm.logprobs import Logprob  # older versions' home\n",
    "outputs.py": """
        from dataclasses import dataclass, field

        @dataclass
        class CompletionOutput:
            index: int
            text: str
            token_ids: list
            cumulative_logprob: float | None
            logprobs: list | None
            finish_reason: str | None = None
            stop_reason: int | str | None = None
            lora_request: object = None

        @dataclass
        class RequestOutput:
            request_id: str
            prompt: str | None
            prompt_token_ids: list | None
            prompt_logprobs: list | None
            outputs: list = field(default_factory=list)
            finished: bool = True
            lora_request: object = None
    """,
    "sampling_params.py": """
        class SamplingParams:
            "vLLM's fields (a msgspec Struct there: unknown keywords are a TypeError); `_verify_args`' checks."

            def __init__(self, n=1, best_of=None, presence_penalty=0.0, frequency_penalty=0.0,
                         repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None,
                         stop=None, stop_token_ids=None, ignore_eos=False, max_tokens=16, min_tokens=0,
                         logprobs=None, prompt_logprobs=None, detokenize=True, skip_special_tokens=True,
                         spaces_between_special_tokens=True, logits_processors=None,
                         include_stop_str_in_output=False, truncate_prompt_tokens=None, output_kind=None,
                         logit_bias=None, allowed_token_ids=None, extra_args=None, bad_words=None):
                self.__dict__.update({k: v for k, v in locals().items() if k != "self"})
                if not isinstance(n, int) or n < 1:
                    raise ValueError(f"n must be at least 1, got {n}.")
                if temperature < 0.0:
                    raise ValueError(f"temperature must be non-negative, got {temperature}.")
                if not 0.0 < top_p <= 1.0:
                    raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
                if max_tokens is not None and max_tokens < 1:
                    raise ValueError(f"max_tokens must be at least 1, got {max_tokens}.")
                if logprobs is not None and logprobs < -1:
                    raise ValueError(f"logprobs must be non-negative or -1, got {logprobs}.")
                if seed is not None and not isinstance(seed, int):
                    raise TypeError(f"seed must be an int, got {type(seed).__name__}")
                if stop_token_ids is not None and not all(isinstance(t, int) for t in stop_token_ids):
                    raise TypeError("stop_token_ids must be a list of int")
    """,
    "lora/__init__.py": "",
    "lora/request.py": """
        from dataclasses import dataclass

        @dataclass(eq=False)
        class LoRARequest:
            lora_name: str
            lora_int_id: int
            lora_path: str = ""
            base_model_name: str | None = None
            tensorizer_config_dict: dict | None = None

            def __post_init__(self):
                if self.lora_int_id < 1:
                    raise ValueError(f"id must be > 0, got {self.lora_int_id}")
                assert self.lora_path, "lora_path cannot be empty"

            def __eq__(self, other):
                return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

            def __hash__(self):
                return hash(self.lora_name)
    """,
    "entrypoints/__init__.py": "",
    "entrypoints/llm.py": """
        import copy, json, os
        from pathlib import Path

        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        import vllm
        from vllm.inputs import TokensPrompt
        from vllm.logprobs import Logprob
        from vllm.lora.request import LoRARequest
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.sampling_params import SamplingParams

        RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
        ENGINE_ARGS = {"tokenizer", "dtype", "seed", "gpu_memory_utilization", "enable_lora", "max_lora_rank",
                       "max_loras", "max_cpu_loras", "max_model_len", "enforce_eager", "logprobs_mode",
                       "max_logprobs", "tensor_parallel_size", "trust_remote_code", "attention_backend"}
        MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


        class LLM:
            def __init__(self, model, **kwargs):
                bad = set(kwargs) - ENGINE_ARGS
                if bad:  # EngineArgs is a dataclass: an unknown field is a TypeError
                    raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument {sorted(bad)[0]!r}")
                if not isinstance(model, str):
                    raise TypeError(f"model must be a str, got {type(model).__name__}")
                self.opts = {"seed": 0, "enable_lora": False, "max_lora_rank": 16, "max_loras": 1,
                             "logprobs_mode": "raw_logprobs", "max_logprobs": 20, "gpu_memory_utilization": 0.9}
                self.opts |= kwargs
                if self.opts["enable_lora"] and self.opts["max_lora_rank"] not in RANKS:
                    raise ValueError(f"max_lora_rank ({self.opts['max_lora_rank']}) must be one of {RANKS}.")
                if self.opts["logprobs_mode"] not in MODES:
                    raise ValueError(f"logprobs_mode must be one of {MODES}")
                if not 0 < self.opts["gpu_memory_utilization"] <= 1:
                    raise ValueError("gpu_memory_utilization must be in (0, 1]")
                vllm.CALLS.append(("LLM", dict(model=model, **kwargs), os.environ.get("VLLM_BATCH_INVARIANT")))
                self.tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
                self.base = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=torch.bfloat16)
                self.loras, self.counter = {}, 0  # adapters cached by lora_int_id, as vLLM's LRU caches do

            def _adapter(self, req):
                if req is None:
                    return self.base
                if not isinstance(req, LoRARequest):
                    raise TypeError(f"lora_request must be a LoRARequest, got {type(req).__name__}")
                if not self.opts["enable_lora"]:
                    raise ValueError(f"LoRA is not enabled! (lora_request {req.lora_name})")
                if req.lora_int_id not in self.loras:  # a cached id is never reloaded from its path
                    cfg = json.loads((Path(req.lora_path) / "adapter_config.json").read_text())
                    if cfg["r"] > self.opts["max_lora_rank"]:
                        raise ValueError(f"LoRA rank {cfg['r']} is greater than max_lora_rank "
                                         f"{self.opts['max_lora_rank']}.")
                    m = PeftModel.from_pretrained(copy.deepcopy(self.base), req.lora_path).eval()
                    self.loras[req.lora_int_id] = m
                return self.loras[req.lora_int_id]

            @torch.no_grad()
            def _sample(self, model, ids, sp):
                gen = torch.Generator().manual_seed(sp.seed if sp.seed is not None else self.opts["seed"])
                stops = set(sp.stop_token_ids or []) | ({self.tok.eos_token_id} if not sp.ignore_eos else set())
                mode, out, lps, finish = self.opts["logprobs_mode"], [], [], "length"
                for _ in range(sp.max_tokens):
                    logits = model(torch.tensor([ids + out])).logits[0, -1].float()
                    raw = logits.log_softmax(-1)
                    if sp.temperature < 1e-5:
                        tok, proc = int(logits.argmax()), raw
                    else:
                        x = logits / sp.temperature
                        if sp.top_p < 1.0:  # vLLM's apply_top_p: drop the low tail whose mass is <= 1 - p
                            s, i = x.sort(descending=False)
                            drop = s.softmax(-1).cumsum(-1) <= 1 - sp.top_p
                            drop[-1] = False
                            x = x.scatter(0, i, s.masked_fill(drop, float("-inf")))
                        probs = x.softmax(-1)
                        q = torch.empty_like(probs).exponential_(generator=gen)
                        tok, proc = int((probs / q).argmax()), x.log_softmax(-1)
                    lp = (raw if mode.startswith("raw") else proc)[tok]
                    out.append(tok)
                    lps.append({tok: Logprob(float(lp), rank=1, decoded_token=self.tok.decode([tok]))})
                    if tok in stops and len(out) >= sp.min_tokens:
                        finish = "stop"
                        break
                return out, lps, finish

            def generate(self, prompts, /, sampling_params=None, *, use_tqdm=True, lora_request=None,
                         priority=None):
                prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
                for p in prompts:
                    if not isinstance(p, dict) or not set(p) <= set(TokensPrompt.__annotations__):
                        raise TypeError(f"prompt must be a TokensPrompt, got {p!r}")
                    if not all(isinstance(t, int) for t in p["prompt_token_ids"]):
                        raise TypeError("prompt_token_ids must be a list of int")
                sps = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(
                    prompts)
                if len(sps) != len(prompts):
                    raise ValueError("The lengths of prompts and sampling_params must be the same.")
                if not all(isinstance(sp, SamplingParams) for sp in sps):
                    raise TypeError("sampling_params must be SamplingParams")
                loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
                if len(loras) != len(prompts):
                    raise ValueError("Lora request list should be the same length as the prompts")
                vllm.CALLS.append(("generate", prompts, sps, lora_request, use_tqdm))
                outs = []
                for p, sp, lr in zip(prompts, sps, loras):
                    if sp.n != 1:
                        raise NotImplementedError("stub: n > 1")
                    ids, lps, finish = self._sample(self._adapter(lr), list(p["prompt_token_ids"]), sp)
                    keep = None if sp.logprobs is None else lps
                    cum = None if sp.logprobs is None else sum(next(iter(d.values())).logprob for d in lps)
                    co = CompletionOutput(0, self.tok.decode(ids, skip_special_tokens=True), ids, cum, keep, finish,
                                          ids[-1] if finish == "stop" else None, lr)
                    outs.append(RequestOutput(str(self.counter), None, list(p["prompt_token_ids"]), None, [co],
                                              True, lr))
                    self.counter += 1
                return outs
    """,
}


@pytest.fixture
def vllm_stub(tmp_path_factory, monkeypatch):
    "The stub `vllm` package on sys.path for one test (removed with its modules and VLLM_BATCH_INVARIANT after)."
    root = tmp_path_factory.mktemp("vllm_stub")
    for rel, src in STUB.items():
        f = root / "vllm" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(src).lstrip())
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "unset")
    monkeypatch.delenv("VLLM_BATCH_INVARIANT")  # restored (absent) after the test; the backend sets it
    monkeypatch.syspath_prepend(str(root))
    import vllm

    yield vllm
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


def digit_share(task, text):
    "A graded reward the reduced snapshot's samples vary in (so that every step moves the adapter)."
    return (sum(c.isdigit() for c in text) / len(text) if text else 0.0), {}


def _cfg(out, snap, **kw):
    from stalebook.rollouts import SamplingConfig
    from stalebook.trainer import TrainConfig

    sc = SamplingConfig(group_size=4, max_new_tokens=8, groups_per_batch=3, backend="vllm", reproducible="seeded")
    base = dict(
        out=str(out), snapshot=str(snap), n_tasks=12, steps=2, prompts_per_step=3, sampling=sc, lineage_steps=(0,)
    )
    return TrainConfig(**(base | dict(lr=0.01) | kw))


def _policy(snap):
    from stalebook.model import LoraSpec, load_policy

    return load_policy(snap, lora=LoraSpec())


def test_the_stub_checks_arguments_as_vllm_does(vllm_stub):
    "The stub refuses what vLLM refuses (so that the backend's calls passing it means something)."
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    with pytest.raises(TypeError, match="unexpected keyword"):
        SamplingParams(max_new_tokens=4)  # HF's name, not vLLM's
    with pytest.raises(TypeError, match="unexpected keyword"):
        LLM(model="x", max_lora_ranks=8)
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("a", 0, "/p")
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_lora_rank"):
        LLM(model="x", enable_lora=True, max_lora_rank=12)
    assert SamplingParams(logprobs=0, seed=2**63 - 1).logprobs == 0
    assert LoRARequest("a", 1, "/p") == LoRARequest("a", 2, "/q")  # vLLM compares adapters by name


def test_grpo_through_the_vllm_backend(tmp_path, tiny_snapshot, vllm_stub):
    """GRPO with `backend: vllm, reproducible: seeded`: one engine on the base snapshot (LoRA on, batch-invariant
    kernels asked for), each step's adapter sent as the LoRARequest of its content hash, one SamplingParams per row
    with the row's seed, the sampled token's log-prob asked for and kept next to the trainer's recomputation."""
    from stalebook.rollouts import VllmSampler, lora_request_id
    from stalebook.trainer import Trainer

    # AdamW's decoupled weight decay moves the LoRA factors at every step whatever the rewards: each step's adapter is
    # another one by construction (the reduced snapshot's groups may all tie in two steps)
    tr = Trainer(_cfg(tmp_path / "a", tiny_snapshot, weight_decay=0.1), reward_fn=digit_share)
    assert isinstance(tr.sampler, VllmSampler)
    tr.run(progress=False)
    recs = [{k: v for k, v in r.items() if k not in TIMING} for r in tr.log.records]
    assert len(recs) == 2
    for r in recs:  # the mismatch diagnostics: bfloat16 engine vs float32 trainer, small and non-zero
        assert r["ratio_max_dev"] < 1e-5
        assert 0 < r["mismatch/logp_abs_diff_mean"] <= r["mismatch/logp_abs_diff_max"] < 1.0
        assert 0 <= r["mismatch/k3_kl"] < 1e-2 and 0 < r["mismatch/is_ess_frac"] <= 1 + 1e-12
    engines = [c for c in vllm_stub.CALLS if c[0] == "LLM"]
    assert len(engines) == 1
    _, kw, env = engines[0]
    assert env == "1" and kw["enable_lora"] is True and kw["max_lora_rank"] == 8 and kw["seed"] == 0
    assert Path(kw["model"]).resolve() == Path(tiny_snapshot).resolve()
    gens = [c for c in vllm_stub.CALLS if c[0] == "generate"]
    assert len(gens) == 2
    hashes = [r["policy_hash"] for r in recs]
    assert len(set(hashes)) == 2  # the weights moved between steps
    for (_, prompts, sps, lora, tqdm), h in zip(gens, hashes):
        assert len(prompts) == len(sps) == 3 * 4 and tqdm is False
        assert lora.lora_int_id == lora_request_id(h) and Path(lora.lora_path).name == h[:32]
        assert all(sp.n == 1 and sp.logprobs == 0 and sp.max_tokens == 8 for sp in sps)
        assert len({sp.seed for sp in sps}) == len(sps)
    again = Trainer(_cfg(tmp_path / "b", tiny_snapshot, weight_decay=0.1), reward_fn=digit_share).run(progress=False)
    assert [{k: v for k, v in r.items() if k not in TIMING} for r in again.log.records] == recs  # seeded: repeats


def test_rollout_store_through_the_vllm_backend(tmp_path, tiny_snapshot, vllm_stub):
    """A rollout store sampled by the vllm backend: per-row seeds from the RNG domains (the same store twice, the
    same seeds and bytes; another group, another seed), the sampler's log-probs stored per completion token."""
    from stalebook.core import Domain
    from stalebook.model import policy_hash
    from stalebook.rollouts import (
        RolloutStore,
        SamplingConfig,
        VllmSampler,
        generate_store,
        numerics_of,
        rollout_domain,
        sample_seeds,
    )
    from stalebook.tasks import synthetic_tasks

    model, tok = _policy(tiny_snapshot)
    tasks = synthetic_tasks("math", 4, Domain(0, ("tasks", "math", 0)))
    sc = SamplingConfig(group_size=3, max_new_tokens=6, groups_per_batch=2, backend="vllm", reproducible="seeded")
    ph = policy_hash(model)
    dom = rollout_domain(0, ph, "vllm")
    stores, seeds = [], []
    for name in ("a", "b"):
        st = RolloutStore(tmp_path / name, ph, dom, sc, [t.id for t in tasks], numerics=numerics_of(model))
        sampler = VllmSampler(model, tok, adapters=tmp_path / f"lora_{name}")
        generate_store(model, tok, tasks, st, progress=False, sampler=sampler, reward_fn=digit_share)
        stores.append((st.path / "groups.jsonl").read_bytes())
        calls = [c for c in vllm_stub.CALLS if c[0] == "generate"]
        seeds.append([sp.seed for c in calls[-2:] for sp in c[2]])
    assert stores[0] == stores[1] and seeds[0] == seeds[1]
    want = [s for t in tasks for s in sample_seeds(dom.child(t.id), sc.group_size)]
    assert seeds[0] == want and len(set(want)) == len(want)  # each row its own seed, each group its own domain
    for line in stores[0].decode().splitlines():
        rec = json.loads(line)
        comps, slp, tf = rec["tokens"], rec["sampler_logp"], rec["logp"]
        assert [len(c) for c in comps] == [len(s) for s in slp] == [len(x) for x in tf]
        assert all(x <= 0 for s in slp for x in s)
        assert 0 < max(abs(a - b) for s, t in zip(slp, tf) for a, b in zip(s, t)) < 0.5  # engine vs trainer numerics


def test_the_published_lora_folder_loads_with_peft(tmp_path, tiny_snapshot, vllm_stub):
    "The folder the backend hands vLLM is a peft adapter with the policy's weights (what vLLM's loader reads)."
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from stalebook.model import adapter_state
    from stalebook.rollouts import VllmSampler

    model, tok = _policy(tiny_snapshot)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.01)  # non-zero B: a fresh LoRA is the identity and would hide a missing tensor
    s = VllmSampler(model, tok, adapters=tmp_path / "lora")
    s.sync_weights(model)
    path = Path(s.lora.lora_path)
    cfg = json.loads((path / "adapter_config.json").read_text())
    assert cfg["r"] == model.peft_config["default"].r and (path / "adapter_model.safetensors").is_file()
    base = AutoModelForCausalLM.from_pretrained(tiny_snapshot, local_files_only=True, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, str(path))
    a, b = adapter_state(model), adapter_state(loaded)
    assert a.keys() == b.keys() and len(a) > 0 and all(torch.equal(a[k], b[k]) for k in a)


def test_lora_ids_are_stable_distinct_and_never_reused(tmp_path, tiny_snapshot):
    """`LoraFolders`: the same content keeps its id and folder (written once), other content gets another id, an
    old id stays bound to its content after its folder is pruned, and an id collision is refused."""
    import stalebook.rollouts as R
    from stalebook.core import StalebookError
    from stalebook.model import policy_hash

    model, _ = _policy(tiny_snapshot)
    lf = R.LoraFolders(tmp_path / "lora", keep=2)
    p0, h0, i0 = lf.publish(model)
    mtime = (p0 / "adapter_model.safetensors").stat().st_mtime_ns
    assert lf.publish(model) == (p0, h0, i0) and (p0 / "adapter_model.safetensors").stat().st_mtime_ns == mtime
    seen = [(h0, i0)]
    for _ in range(3):
        with torch.no_grad():
            next(p for n, p in model.named_parameters() if "lora_B" in n).add_(0.01)
        _, h, i = lf.publish(model)
        seen.append((h, i))
    assert len({h for h, _ in seen}) == len({i for _, i in seen}) == 4 and all(0 < i < 2**31 for _, i in seen)
    assert not p0.exists() and lf.ids[i0] == h0  # pruned from disk, the id still bound to its content
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n).add_(0.01)
    lf.ids[R.lora_request_id(policy_hash(model))] = h0  # a collision: the new content's id already given to h0
    with pytest.raises(StalebookError, match="never reused"):
        lf.publish(model)
