"""Preflight: a correct snapshot passes the CLI; one line per failure without reading weights; compute mode
blocks the network and credential discovery; the embedded snapshot is reused or repaired."""

from conftest import CLI, run_code

from stalebook.core import hash_dir
from stalebook.snapshot import LOCKFILE, read_lock, verify_snapshot


def test_correct_snapshot_passes_cli(snap):
    r = run_code(CLI, "preflight", snap)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("preflight: OK") and read_lock(snap)["revision"] in r.stdout
    assert verify_snapshot(snap) == []
    assert read_lock(snap)["revision"] == hash_dir(snap, exclude=[LOCKFILE])


def test_cli_prints_one_line_per_failure_and_reads_no_weights(snap):
    p = snap / "model.safetensors"
    b = bytearray(p.read_bytes())
    b[-1] ^= 0xFF
    p.write_bytes(bytes(b))
    (snap / "tokenizer_config.json").unlink()
    (snap / "x.bin").write_bytes(b"x")
    code = """
    import sys
    opened = []
    sys.addaudithook(lambda ev, a: opened.append(str(a[0]))
                     if ev == "open" and isinstance(a[0], str) and a[0].endswith("safetensors") else None)
    from stalebook.cli import main
    rc = main(sys.argv[1:])
    print("MODULES", "torch" in sys.modules, "safetensors" in sys.modules, "transformers" in sys.modules, len(opened))
    sys.exit(rc)
    """
    r = run_code(code, "preflight", snap)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 1
    assert lines[:-1] == [
        "preflight: FAIL file missing: tokenizer_config.json",
        "preflight: FAIL extra file: x.bin",
        lines[2],
    ] and lines[2].startswith("preflight: FAIL hash mismatch: model.safetensors")
    assert lines[-1] == "MODULES False False False 1"  # only the hash read touched the weights file


def test_planted_token_file_not_read(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "token").write_text("hf_plantedHOMEtoken\n")
    custom = tmp_path / "mytoken"
    custom.write_text("hf_plantedCUSTOMtoken\n")
    code = """
    import os, sys
    opened = []
    sys.addaudithook(lambda ev, a: opened.append(os.fsdecode(a[0]))
                     if ev == "open" and isinstance(a[0], (str, bytes)) and "token" in os.fsdecode(a[0]) else None)
    import huggingface_hub
    from huggingface_hub import get_token
    if sys.argv[1] == "compute":
        from stalebook.preflight import enter_compute_mode
        enter_compute_mode()
    print("TOKEN", get_token())
    print("OPENED", [p for p in opened if p in sys.argv[2:]])
    if sys.argv[1] == "compute":                        # even a direct read of the configured token file is refused
        try: open(sys.argv[2]).read(); print("READ", sys.argv[2])
        except PermissionError as e: print("REFUSED", e)
    """
    for tok_env, planted, path in [
        ({"HF_HOME": str(hf)}, "hf_plantedHOMEtoken", hf / "token"),
        ({"HF_HOME": str(hf), "HF_TOKEN_PATH": str(custom)}, "hf_plantedCUSTOMtoken", custom),
        ({"HF_HOME": str(hf), "HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": ""}, "hf_plantedHOMEtoken", hf / "token"),
    ]:
        ctl = run_code(code, "control", path, env_extra=tok_env)
        assert f"TOKEN {planted}" in ctl.stdout, ctl.stderr  # the planted file WOULD change behaviour
        assert f"OPENED ['{path}'" in ctl.stdout  # (huggingface_hub opens it, maybe twice)
        r = run_code(code, "compute", path, env_extra=tok_env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [
            "TOKEN None",
            "OPENED []",
            f"REFUSED compute mode: reading the Hugging Face token file {path} is refused",
        ], r.stdout


def test_network_refused_in_compute_mode_loopback_allowed():
    code = """
    import socket, threading
    from stalebook.preflight import enter_compute_mode, NetworkRefused
    env = enter_compute_mode()
    import os
    print("ENV", os.environ["HF_HUB_OFFLINE"], os.environ["TRANSFORMERS_OFFLINE"],
          os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"], "HF_TOKEN" in os.environ)
    for f in (lambda: socket.socket().connect(("93.184.216.34", 80)), lambda: socket.getaddrinfo("huggingface.co", 443),
              lambda: socket.gethostbyname("example.com")):
        try: f(); print("ALLOWED")
        except NetworkRefused as e: print("REFUSED", e, isinstance(e, OSError))
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    c = socket.create_connection(srv.getsockname(), timeout=2); print("LOOPBACK ok"); c.close(); srv.close()
    try:
        import huggingface_hub; huggingface_hub.hf_hub_download("gpt2", "config.json"); print("DOWNLOADED")
    except Exception as e: print("HUB", type(e).__name__)
    """
    r = run_code(code, env_extra={"HF_TOKEN": "hf_x"})
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "ENV 1 1 1 False"
    assert out[1] == "REFUSED compute mode: network access refused (socket.connect ('93.184.216.34', 80)) True"
    assert out[2] == "REFUSED compute mode: network access refused (socket.getaddrinfo 'huggingface.co') True"
    assert out[3] == "REFUSED compute mode: network access refused (socket.gethostbyname 'example.com') True"
    assert out[4] == "LOOPBACK ok" and out[5].startswith("HUB ") and "DOWNLOADED" not in r.stdout
