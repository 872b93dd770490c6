import os

from agentgym.runtime.files import fsync_dir, fsync_tree


def test_fsync_tree_flushes_every_file_and_folder(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for rel in ("x.bin", "a/y.bin", "a/b/z.bin"):
        (tmp_path / rel).write_bytes(b"data")
    synced: list[str] = []
    real = os.fsync

    def spy(fd):  # records the path behind each flushed descriptor
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    fsync_tree(tmp_path)
    want = {str(tmp_path / p) for p in ("x.bin", "a/y.bin", "a/b/z.bin", "a", "a/b")}
    assert want | {str(tmp_path)} == set(synced)
    synced.clear()
    fsync_dir(tmp_path / "a")
    assert synced == [str(tmp_path / "a")]
