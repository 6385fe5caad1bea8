"""atomic.py: a file or folder appears whole or not at all, and the temporary is never followed."""
import errno
import io
import os
import subprocess
import uuid

import pytest
import torch

import atomic
from atomic import atomic_directory, atomic_write
from training.checkpoint import Checkpoint


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "out.json"
    with atomic_write(path, "w") as f:
        f.write("first")
    with atomic_write(path) as f:
        f.write(b"second")
    assert path.read_text() == "second" and os.listdir(path.parent) == ["out.json"]


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"good")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(path) as f:
            f.write(b"half")
            raise KeyboardInterrupt  # killed mid-write
    assert path.read_bytes() == b"good" and os.listdir(tmp_path) == ["ckpt.pt"]


def test_the_temporary_is_opened_exclusively(tmp_path, monkeypatch):
    # Someone plants a link under the temporary's name: it must be refused, not followed.
    fixed = uuid.UUID(int=0)
    monkeypatch.setattr(uuid, "uuid4", lambda: fixed)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "metrics.jsonl"
    (tmp_path / f".{path.name}.{os.getpid()}.{fixed.hex[:8]}.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        with atomic_write(path, "w") as f:
            f.write("overwrite?")
    assert victim.read_text() == "precious" and not path.exists()


def test_atomic_directory_replaces_a_folder_whole_or_not_at_all(tmp_path, monkeypatch):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with atomic_directory(out) as folder:
        (folder / "config.json").write_text("{}")
    assert os.listdir(out) == ["config.json"] and os.listdir(tmp_path) == ["hf"]
    with pytest.raises(RuntimeError):
        with atomic_directory(out) as folder:
            (folder / "model.safetensors").write_bytes(b"partial")
            raise RuntimeError("disk full")
    assert os.listdir(out) == ["config.json"] and os.listdir(tmp_path) == ["hf"]


def test_only_whole_file_modes():
    with pytest.raises(ValueError, match="mode 'wb' or 'w'"):
        with atomic_write("x", "a"):
            pass


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (root can mount one here and in CI); skipped where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()})")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_keeps_the_last_checkpoint_and_says_disk_full(small_disk):
    path = small_disk / "ckpt.pt"
    small = Checkpoint(model={"w": torch.ones(1000)}, model_args={}, optimizer={}, scaler={}, step=1, tokens=0,
                       rng=[], train_loader={}, config={})
    small.save(path)
    good = path.read_bytes()
    big = Checkpoint(**{**vars(small), "model": {"w": torch.zeros(2_000_000)}, "step": 2})  # 8 MB
    with pytest.raises(OSError, match=rf"disk full writing {path}: about 8,000,000 bytes are needed, [\d,]+ bytes "
                                      r"are free there; what was at ckpt.pt before is intact") as error:
        big.save(path)
    assert error.value.errno == errno.ENOSPC
    assert os.listdir(small_disk) == ["ckpt.pt"] and path.read_bytes() == good  # no temporary left
    assert Checkpoint.load(path).step == 1


def test_a_full_disk_at_the_last_flush_still_says_disk_full(tmp_path, monkeypatch):
    """What is still buffered meets the full disk at the final flush, and again when the temporary
    file closes (a failure injected: the file's flush and close raise ENOSPC, as a full disk makes
    them): that second ENOSPC must not replace the message."""
    class FullDiskFile(io.BytesIO):
        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            if not self.closed:
                super().close()
                raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "open", lambda *args, **kwargs: FullDiskFile(), raising=False)
    path = tmp_path / "ckpt.pt"
    with pytest.raises(OSError, match=rf"disk full writing {path}: 5,000 bytes were written when it filled") as error:
        with atomic_write(path, "wb") as f:
            f.write(b"x" * 5000)
    assert error.value.errno == errno.ENOSPC and not path.exists()
