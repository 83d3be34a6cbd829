"""Bad input and security through real `train.py` processes: a few rows of the table of mistakes
(the whole table runs in-process in tests/unit/test_bad_inputs.py) stop with one line `error: ...`
and exit 2 before step 1, running no code from the config; a multirun keeps every secret off disk
and out of the output, its run dir private, with one directory per job; the recorded precision
and data are what ran; a resume is exact and quiet; a config typo is reported before
torch or Lightning is imported.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo import REPO_ROOT
from tests.unit.test_bad_inputs import (
    CASES,
    ENV_SECRET,
    SECRET,
    _environment,
    _overrides,
    fast,
    write,
)

# --- W&B without a network --------------------------------------------------------------------


# --- end to end -------------------------------------------------------------------------------


def train_py(*args: str, env: dict | None = None, unset: tuple[str, ...] = (), timeout=600):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    for name in unset:
        full_env.pop(name, None)
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "train.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env=full_env,
    )


E2E_CASES = ["strategy target", "hydra callback", "internal schema", "empty data file",
             "W&B online without a key", "W&B online with a closed server"]  # fmt: skip


@pytest.mark.slow
def test_errors_are_one_line_from_train_py(tmp_path):
    for case in [c for c in CASES if c.name in E2E_CASES]:
        tmp = tmp_path / case.name.replace(" ", "_").replace("&", "")
        tmp.mkdir()
        if case.prepare:
            case.prepare(tmp)
        env = _environment(case.env, tmp)
        result = train_py(
            *_overrides(case, tmp),
            f"hydra.run.dir={tmp / 'run'}",
            timeout=120,
            env={k: v for k, v in env.items() if v is not None},
            unset=tuple(k for k, v in env.items() if v is None),
        )
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, f"{case.name}: {result.stderr[-2000:]}"
        assert len(lines) == 1 and case.expect in lines[0], f"{case.name}: {lines}"
        assert SECRET not in result.stdout + result.stderr
        assert not (tmp / "marker").exists(), f"{case.name} ran the command"
        assert not (tmp / "run" / "summary.json").exists()


@pytest.mark.slow
def test_secrets_stay_secret_and_the_run_dir_private(tmp_path):
    """A multirun (one and two ranks) with W&B offline and checkpoints: one directory per job,
    the same losses in both, and a secret from the environment and one from an override appear
    in no file, no log and no output."""
    result = train_py(
        "-m",
        "strategy=single,ddp",
        "model=llama_debug",
        "data=synthetic",
        "logger=wandb",
        "trainer.val_check_interval=null",
        "trainer.max_steps=3",
        "trainer.log_every_n_steps=1",
        "trainer.checkpoint.every_n_train_steps=2",
        f"+hydra.job.env_set.WANDB_API_KEY={SECRET}",
        f"hydra.sweep.dir={tmp_path}",
        env={"HF_TOKEN": ENV_SECRET, "WANDB_MODE": "offline"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert jobs == ["0", "1"], jobs  # one directory per job
    summaries = [json.loads((tmp_path / job / "summary.json").read_text()) for job in jobs]
    assert [s["strategy"] for s in summaries] == ["single", "ddp"]
    assert summaries[0]["losses"] == pytest.approx(summaries[1]["losses"], rel=1e-5)
    for job in jobs:
        assert list((tmp_path / job / "wandb").glob("offline-run-*"))
        assert list((tmp_path / job / "checkpoints").glob("step*.ckpt"))
        overrides = (tmp_path / job / ".hydra" / "hydra.yaml").read_text()
        assert "WANDB_API_KEY=<redacted>" in overrides  # the override is kept, its value not
    leaks = [
        str(p)
        for p in tmp_path.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and (SECRET.encode() in p.read_bytes() or ENV_SECRET.encode() in p.read_bytes())
    ]
    assert not leaks
    for text in (result.stdout, result.stderr):
        assert SECRET not in text and ENV_SECRET not in text
    loose = [
        f"{oct(p.stat().st_mode & 0o777)} {p}"
        for p in [tmp_path, *tmp_path.rglob("*")]
        if not p.is_symlink() and stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)
    ]
    assert not loose


@pytest.mark.slow
def test_recorded_precision_and_data_are_what_ran(tmp_path):
    corpus = tmp_path / "corpus"
    for i in range(4):
        write(corpus / f"f{i}.txt", f"text number {i} " * 200)
    result = train_py(
        *fast(
            "trainer.precision=bf16-mixed",
            "trainer.max_steps=2",
            f"data.paths=[{corpus}]",
            "data.seq_len=32",
            "data.global_batch_size=2",
            data="text",
        ),
        f"hydra.run.dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["precision"] == "bf16-mixed"
    assert summary["data"]["files"] == 4 and summary["data"]["bytes"] > 0
    assert summary["data"]["first_paths"][0].endswith("f0.txt")


@pytest.mark.slow
def test_resume_is_exact_and_quiet(tmp_path):
    """Lightning's 'dataloader is not resumable' warning is gone, and rightly: the resumed steps
    repeat the uninterrupted run's losses exactly."""
    common = [*fast("trainer.max_steps=4"), "trainer.checkpoint.every_n_train_steps=2"]
    first = train_py(*common, f"hydra.run.dir={tmp_path / 'a'}")
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = tmp_path / "a" / "checkpoints" / "step2.ckpt"
    resumed = train_py(
        *common, f"trainer.ckpt_path={checkpoint}", f"hydra.run.dir={tmp_path / 'b'}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "not resumable" not in resumed.stderr + resumed.stdout
    full = json.loads((tmp_path / "a" / "summary.json").read_text())["losses"]
    # Steps 1-2 come from the checkpoint's history, 3-4 were run again: the whole run.
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["losses"] == full


def test_a_config_typo_is_reported_before_torch_or_lightning_is_imported(tmp_path):
    """train.py's key check runs before anything heavy is imported: one line, exit 2."""
    result = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            str(REPO_ROOT / "train.py"),
            "+no_such_key=1",
            f"hydra.run.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()}
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert "unknown config key no_such_key" in errors[0]
    assert not {"torch", "lightning"} & imported, sorted({"torch", "lightning"} & imported)


# --- the checkpoint folder as a user who is not root, and a full disk --------------------------

TEST_USER = "ld_tester"


@pytest.fixture
def test_user():
    """(uid, gid) of a user without privileges (added by root with useradd, removed after),
    allowed by an ACL of its own to enter the folders above this interpreter and its
    environment (/root is mode 700 on the CI machine), and nothing more; the ACLs go after."""
    import pwd
    import shutil as sh

    if os.geteuid() != 0 or not (sh.which("useradd") and sh.which("setfacl")):
        pytest.skip("permissions are checked as a user added by root (needs useradd, setfacl)")
    added = False
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", TEST_USER], check=True)
        added = True
    entry = pwd.getpwnam(TEST_USER)
    folders = {
        parent
        for path in (
            Path(sys.executable).resolve(),
            Path(sys.prefix).resolve(),
            REPO_ROOT.resolve(),
        )
        for parent in path.parents
        if parent != Path("/")
    }
    opened = []
    try:
        for folder in sorted(folders):
            subprocess.run(["setfacl", "-m", f"u:{TEST_USER}:x", str(folder)], check=True)
            opened.append(folder)
        yield entry.pw_uid, entry.pw_gid
    finally:
        for folder in opened:
            subprocess.run(["setfacl", "-x", f"u:{TEST_USER}", str(folder)])
        if added:
            subprocess.run(["userdel", TEST_USER])


@pytest.mark.slow
def test_checkpoint_folders_a_user_cannot_use_and_a_full_disk_stop_before_step_1(test_user):
    """As a user who is not root (root reads and writes anything): a checkpoint to resume that it
    cannot read, a checkpoint folder it cannot read (trainer.resume=auto) or write; and, as root,
    a checkpoint folder on a 1 MiB tmpfs while one checkpoint of llama_debug takes 2.4 MiB. Each
    is one line and exit 2 from train.py before step 1. The four runs start together. (A folder
    below a file is a row of the in-process table.)"""
    import shutil as sh
    import tempfile

    from tests.unit.test_bad_inputs import resumable_checkpoint

    uid, gid = test_user
    root = Path(tempfile.mkdtemp(prefix="ld-permissions-"))
    root.chmod(0o755)
    locked = root / "locked"  # root's, mode 700: the user can neither read nor enter it
    resumable_checkpoint(locked)
    locked.chmod(0o700)
    readonly = root / "readonly"  # root's, mode 755: the user lists it but cannot write
    for file in resumable_checkpoint(readonly).iterdir():
        file.chmod(0o600)  # nor read the checkpoint's files
    full = root / "tmpfs"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)]).returncode:
        sh.rmtree(root)
        pytest.skip("no tmpfs could be mounted here")
    run_dirs = {}
    for name in ("ckpt_path", "resume_auto", "not_writable", "full_disk"):
        run_dirs[name] = root / "runs" / name
        run_dirs[name].mkdir(parents=True)
        os.chown(run_dirs[name], uid, gid)
    cases = {  # name: (overrides, as the user, the one line holds)
        "ckpt_path": ([f"trainer.ckpt_path={readonly}/step1.ckpt",
                       f"trainer.checkpoint.dirpath={run_dirs['ckpt_path']}/c"], True,
                      "step1.ckpt cannot be read (Permission denied: "),
        "resume_auto": (["trainer.resume=auto", f"trainer.checkpoint.dirpath={locked}"], True,
                        f"trainer.resume=auto cannot read the checkpoint folder {locked} "
                        "(Permission denied)"),
        "not_writable": ([f"trainer.checkpoint.dirpath={readonly}"], True,
                         "cannot be written: this user may not write to it"),
        "full_disk": ([f"trainer.checkpoint.dirpath={full}/c",
                       "trainer.checkpoint.every_n_train_steps=1"], False,
                      "is on a filesystem with 1.0 MiB free, but one checkpoint of this model takes 2.4 MiB"),
    }  # fmt: skip
    procs = {}
    try:
        for name, (overrides, as_user, _) in cases.items():
            user = {"user": uid, "group": gid, "extra_groups": []} if as_user else {}
            procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    str(REPO_ROOT / "train.py"),
                    *fast("trainer.max_steps=2"),
                    *overrides,
                    f"hydra.run.dir={run_dirs[name]}",
                ],
                cwd=run_dirs[name],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={
                    "PATH": os.environ.get("PATH", ""),
                    "OMP_NUM_THREADS": "1",
                    "HOME": str(run_dirs[name]),
                    "LANG": "C.UTF-8",
                },
                **user,
            )
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            lines = [line for line in err.splitlines() if line.strip()]
            assert proc.returncode == 2, f"{name}: {err[-3000:]}"
            assert len(lines) == 1 and lines[0].startswith("error:"), f"{name}: {lines}"
            assert cases[name][2] in lines[0], f"{name}: {lines}"
            assert "step 1/" not in out and not (run_dirs[name] / "summary.json").exists()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        subprocess.run(["umount", str(full)])
        sh.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_a_refusal_in_a_users_own_script_is_one_line():
    """tests/user_script_refusal.py, plain Lightning: Parallel3DStrategy(tp=2, pp=2) on 2 ranks
    is refused after Lightning's launcher started both; one `error:` line (rank 0's), no
    traceback, exit status 2 (lightning_dist/runtime/refusal.py)."""
    script = REPO_ROOT / "tests" / "user_script_refusal.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env=env,
    )
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert result.returncode == 2, output[-3000:]
    assert errors == [
        "error: world size 2 is not divisible by pp=2, dp_replicate=1, "
        "dp_shard=-1, cp=1, tp=2 (product 4)"
    ], output[-3000:]
    assert "Traceback" not in output and "[rank" not in output, output[-3000:]
