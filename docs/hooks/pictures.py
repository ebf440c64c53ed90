"""The pictures of the command pages, made by the commands they show (not committed).

    python docs/hooks/pictures.py build/docs-pictures     # makes them by hand

As the mkdocs hook (``hooks:`` in mkdocs.yml) it makes them into ``build/docs-pictures`` when
they are not there yet, or were made by other commands (about a minute on 2 cores: a tiny
dataset collected, a tiny run trained with a decoder, then ``swm preview`` and ``swm eval
--video``), and adds them to the site as ``pictures/NAME.png``. The commands' output is shown
only when one fails, which fails the build. Each picture is one frame of a video the command
wrote, read back with PyAV (the ``docs`` extra installs it):

- ``preview.png``: frame 10 of ``swm preview data/tiny.lance --index 0``;
- ``eval-video.png``: the last frame of ``swm eval runs/tiny-decoder --video``'s first episode.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
CACHE = ROOT / "build" / "docs-pictures"
NAMES = ("preview.png", "eval-video.png")
COMMANDS = (
    "swm collect --preset tiny --out data/tiny.lance",
    "swm preview data/tiny.lance --index 0 --out previews",
    "swm train --preset tiny --data data/tiny.lance --out runs/tiny-decoder --steps 300 "
    "--set model.reconstruction_weight=1",
    "swm eval runs/tiny-decoder --episodes 1 --video",
)


STAMP = "commands.txt"  # the commands the pictures beside it were made by


class PictureError(Exception):
    """A command of ``COMMANDS`` failed: what it printed."""


def make_pictures(out: Path) -> None:
    """Run ``COMMANDS`` in a fresh scratch folder under ``out``; one frame of each video as a
    PNG."""
    import shutil

    import av
    from PIL import Image

    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (out / STAMP).unlink(missing_ok=True)
    for command in COMMANDS:
        argv = [sys.executable, "-m", "swmcli", *command.split()[1:]]
        done = subprocess.run(argv, cwd=work, capture_output=True, text=True)
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip().splitlines()[-20:]
            raise PictureError(f"`{command}` failed (exit {done.returncode}):\n" + "\n".join(said))
    eval_videos = work / "runs" / "tiny-decoder" / "eval" / "videos"
    videos = {
        "preview.png": (work / "previews" / "episode_0.mp4", 10),
        "eval-video.png": (eval_videos / "episode_1.mp4", -1),
    }
    for name, (video, index) in videos.items():
        with av.open(str(video)) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        Image.fromarray(frames[index]).save(out / name)
    (out / STAMP).write_text("\n".join(COMMANDS))


def _made(out: Path) -> bool:
    """Whether ``out`` holds every picture, made by today's ``COMMANDS``."""
    stamp = out / STAMP
    made = stamp.is_file() and stamp.read_text() == "\n".join(COMMANDS)
    return made and all((out / name).is_file() for name in NAMES)


def on_files(files, config):
    """mkdocs: the pictures (made once, then kept in ``CACHE``) as ``pictures/NAME``."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    if not _made(CACHE):
        try:
            make_pictures(CACHE)
        except ImportError as err:
            raise PluginError(f'docs/hooks/pictures.py: {err}; pip install -e ".[docs]"') from err
        except PictureError as err:
            raise PluginError(f"docs/hooks/pictures.py: {err}") from err
    for name in NAMES:
        files.append(File.generated(config, f"pictures/{name}", abs_src_path=str(CACHE / name)))
    return files


if __name__ == "__main__":
    make_pictures(Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE)
