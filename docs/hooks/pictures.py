"""The pictures of the command pages, made by the commands they show (not committed).

    python docs/hooks/pictures.py build/docs-pictures     # makes them by hand

As the mkdocs hook (``hooks:`` in mkdocs.yml) it makes them into ``build/docs-pictures`` when
they are not there yet (about a minute on 2 cores: a tiny dataset collected, a tiny run trained
with a decoder, then ``swm preview`` and ``swm eval --video``) and adds them to the site as
``pictures/NAME.png``. Each picture is one frame of a video the command wrote, read back with
PyAV:

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


def make_pictures(out: Path) -> None:
    """Run ``COMMANDS`` in a scratch folder under ``out``; one frame of each video as a PNG."""
    import av
    from PIL import Image

    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    for command in COMMANDS:
        argv = [sys.executable, "-m", "swmcli", *command.split()[1:]]
        subprocess.run(argv, cwd=work, check=True, stdout=subprocess.DEVNULL)
    eval_videos = work / "runs" / "tiny-decoder" / "eval" / "videos"
    videos = {
        "preview.png": (work / "previews" / "episode_0.mp4", 10),
        "eval-video.png": (eval_videos / "episode_1.mp4", -1),
    }
    for name, (video, index) in videos.items():
        with av.open(str(video)) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        Image.fromarray(frames[index]).save(out / name)


def on_files(files, config):
    """mkdocs: the pictures (made once, then kept in ``CACHE``) as ``pictures/NAME``."""
    from mkdocs.structure.files import File

    if not all((CACHE / name).is_file() for name in NAMES):
        make_pictures(CACHE)
    for name in NAMES:
        files.append(File.generated(config, f"pictures/{name}", abs_src_path=str(CACHE / name)))
    return files


if __name__ == "__main__":
    make_pictures(Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE)
