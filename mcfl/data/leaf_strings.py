"""LEAF rows given as strings: Shakespeare's lines of text and CelebA's image file names.

Two LEAF datasets (Caldas et al., 2018, arXiv:1812.01097) store ``x`` rows as strings, not as
lists of numbers:

- Shakespeare (next-character prediction): each row is 80 characters of a speaking role's
  lines and its label ``y`` the single character that follows. LEAF's models map characters
  to their index in the 80-character ``ALL_LETTERS`` of LEAF's
  ``models/utils/language_utils.py`` (`VOCABULARY` here), and so does mcfl: ``x`` becomes
  float32 [N, 80] indices (exact in float32, the dtype of every other dataset's rows; a model
  that embeds characters casts them back to integers), ``y`` the next character's index, 80
  classes. LEAF's lookup (``str.find``) turns a character outside the vocabulary into -1,
  silently; mcfl refuses it.
- CelebA: each row is an image file name under ``raw/img_align_celeba``, read as RGB pixels.

The rule that tells them apart (`row_kind`): a string that ends in an image file suffix
(.jpg, .jpeg or .png, in any case) names an image file; any other string is text. A block of
rows is of the kind of its first row, and `mcfl.data.leaf` holds every block of a dataset to
the kind of the first. The labels part them too: text takes single characters, images class
numbers, so a row read as the wrong kind is refused, never misread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from mcfl.errors import DataError

VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
NUM_LETTERS = len(VOCABULARY)  # 80
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
IMAGE_FOLDER = Path("raw") / "img_align_celeba"
# The kinds of x rows, as the errors name them.
NUMBERS, IMAGES, TEXT = "rows of numbers", "image file names", "text"

_INDEX = np.full(128, -1, np.int64)  # ASCII code -> vocabulary index, -1 outside it
_INDEX[[ord(c) for c in VOCABULARY]] = np.arange(NUM_LETTERS)


def _shown(value: Any) -> str:
    """A value read from JSON as its JSON text, cut to 40 characters (no line break)."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def row_kind(row: Any) -> str:
    """NUMBERS, IMAGES or TEXT: the kind of x rows whose first row is `row`."""
    if not isinstance(row, str):
        return NUMBERS
    return IMAGES if row.lower().endswith(IMAGE_SUFFIXES) else TEXT


def _indices(codes: np.ndarray) -> np.ndarray:
    """Vocabulary indices of Unicode code points, -1 for one outside the vocabulary."""
    return np.where(codes < len(_INDEX), _INDEX[np.minimum(codes, len(_INDEX) - 1)], -1)


def text_rows(rows: list, where: str) -> np.ndarray:
    """Rows of text as float32 [N, L] vocabulary indices, L the first row's length."""
    odd = next((i for i, row in enumerate(rows) if not isinstance(row, str)), None)
    if odd is not None:
        raise DataError(f"x of {where} mixes text rows with other values: row {odd} is "
                        f"{_shown(rows[odd])}, row 0 a string")
    width = len(rows[0])
    if width == 0:
        raise DataError(f"x row 0 of {where} is an empty string; a text row needs characters")
    other = next((i for i, row in enumerate(rows) if len(row) != width), None)
    if other is not None:
        raise DataError(f"x row {other} of {where} has {len(rows[other])} characters "
                        f"({_shown(rows[other])}), row 0 has {width}; every row must have the "
                        "same length")
    codes = np.array(rows, dtype=f"<U{width}").view(np.uint32).reshape(len(rows), width)
    indices = _indices(codes)
    if (indices < 0).any():
        row, column = (int(i[0]) for i in np.nonzero(indices < 0))
        raise DataError(f"x of {where} holds {_shown(chr(codes[row, column]))} (row {row}, "
                        f"character {column}), which is not in LEAF Shakespeare's "
                        f"{NUM_LETTERS}-character vocabulary (mcfl.data.leaf_strings.VOCABULARY)")
    return indices.astype(np.float32)


def character_labels(values: list, where: str) -> np.ndarray:
    """Labels of text rows, each the next character, as int64 vocabulary indices."""
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str) or len(v) != 1), None)
    if bad is not None:
        raise DataError(f"labels of {where} must be single characters, as its x rows are text "
                        "(strings not ending in .jpg, .jpeg or .png), got "
                        f"{_shown(values[bad])} (label {bad})")
    indices = _indices(np.array(values, dtype="<U1").view(np.uint32))
    if (indices < 0).any():
        bad = int(np.flatnonzero(indices < 0)[0])
        raise DataError(f"label {bad} of {where} is {_shown(values[bad])}, which is not in LEAF "
                        f"Shakespeare's {NUM_LETTERS}-character vocabulary "
                        "(mcfl.data.leaf_strings.VOCABULARY)")
    return indices.astype(np.int64)


def find_image_dir(root: Path, where: str) -> Path:
    """CelebA's image folder: raw/img_align_celeba in the LEAF folder or beside it."""
    candidates = (root / IMAGE_FOLDER, root.parent / IMAGE_FOLDER)
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise DataError(f"x of {where} names image files, but no image folder exists (looked for "
                    f"{candidates[0]} and {candidates[1]})")


def load_images(paths: list[Path], image_size: int) -> np.ndarray:
    """RGB images resized to image_size x image_size, float32 in [0, 1], [N, S, S, 3]."""
    images = np.empty((len(paths), image_size, image_size, 3), np.float32)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                rgb = image.convert("RGB").resize((image_size, image_size),
                                                  Image.Resampling.BILINEAR)
        except FileNotFoundError:
            raise DataError(f"image file {path} does not exist") from None
        except (UnidentifiedImageError, OSError) as err:
            raise DataError(f"image file {path} cannot be read: {err}") from None
        images[i] = np.asarray(rgb, np.float32)
    images /= 255.0
    return images
