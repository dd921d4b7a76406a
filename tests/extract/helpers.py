"""Helpers shared by the extraction tests (generated images, tiny model configs); the runner tests use them too."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

TINY_CLIP = "oodbench-tiny-clip"
TINY_CLIP_CONFIG = {
    "embed_dim": 16,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def write_images(root: Path, classes: dict[str, int], *, size=(24, 30), seed: int = 0, corrupt: list[str] = ()) -> Path:
    """Random RGB PNGs in class sub-folders, plus corrupt files at the given relative paths."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name, count in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"img{i:03d}.png")
    for relative in corrupt:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    return root


def register_tiny_clip(folder: Path) -> Path:
    """Write the tiny open_clip architecture's config (<TINY_CLIP>.json) into `folder`, register it, return the file."""
    import open_clip

    folder.mkdir(parents=True, exist_ok=True)
    config_file = folder / f"{TINY_CLIP}.json"
    config_file.write_text(json.dumps(TINY_CLIP_CONFIG))
    if TINY_CLIP not in open_clip.list_models():
        open_clip.add_model_config(config_file)
    return config_file


@contextlib.contextmanager
def single_torch_thread() -> Iterator[None]:
    """One intra-op thread: on a shared, oversubscribed 2-core machine spinning OpenMP threads slow small ops ~20x."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _char_tokenizer():
    """A CLIP tokenizer over single characters (no merges): enough for label names in tests."""
    import string

    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for char in string.ascii_lowercase + string.digits + ".,'-":
        vocab[char] = len(vocab)
        vocab[char + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[])


def _save_with_processor(folder: Path, model, tokenizer) -> Path:
    """Save a tiny model with a CLIP processor (32 px images, the given tokenizer) to `folder`."""
    from transformers import CLIPImageProcessor, CLIPProcessor

    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        tokenizer=tokenizer,
    )
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def write_tiny_hf_clip(folder: Path, *, seed: int = 0) -> Path:
    """A tiny random transformers CLIPModel with its processor (character tokenizer, 32 px), saved to `folder`."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    tokenizer = _char_tokenizer()
    vocab_size = len(tokenizer.get_vocab())
    text = {"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    text.update(num_attention_heads=2, max_position_embeddings=32, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    vision.update(image_size=32, patch_size=8)
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    return _save_with_processor(folder, model, tokenizer)


def write_tiny_aimv2(folder: Path, *, seed: int = 0) -> Path:
    """A tiny random transformers AIMv2 (LiT layout: attention-pooling head, visual projection), saved with a processor."""
    import torch
    from transformers import Aimv2Config, Aimv2Model

    tokenizer = _char_tokenizer()
    vocab_size = len(tokenizer.get_vocab())
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32)
    vision.update(patch_size=8, qkv_bias=True, use_head=True)
    text = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    text.update(max_position_embeddings=32, eos_token_id=1)
    torch.manual_seed(seed)
    model = Aimv2Model(Aimv2Config(vision_config=vision, text_config=text, projection_dim=16))
    return _save_with_processor(folder, model, tokenizer)


def shared_folder() -> Path | None:
    """`../shared` beside the repository (in a git worktree: beside its main checkout too), or None when absent."""
    repo = Path(__file__).resolve().parents[2]
    candidates = [repo.parent / "shared"]
    marker = repo / ".git"
    if marker.is_file():  # a worktree: ".git" reads "gitdir: <main>/.git/worktrees/<name>"
        text = marker.read_text(encoding="utf-8").strip()
        if text.startswith("gitdir:"):
            candidates.append(Path(text[len("gitdir:") :].strip()).parents[2].parent / "shared")
    return next((path for path in candidates if path.is_dir()), None)


def shared_lists() -> Path | None:
    """The official image lists in `../shared/data/imagelists`, or None when absent (a user's clone)."""
    shared = shared_folder()
    lists = shared / "data" / "imagelists" if shared is not None else None
    return lists if lists is not None and lists.is_dir() else None
