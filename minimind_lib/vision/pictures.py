"""Pictures in transit: an image array as a ``data:image/png;base64,...`` URL and back, as the
OpenAI API sends them to the server (``image_url`` parts).
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings

import numpy as np

#: the largest picture read (width x height), checked from the file's header before decoding: a
#: small compressed file can hold an enormous picture (a 48 KB PNG of 200 M pixels); the models
#: read 64 x 64, so 4096 x 4096 leaves room for any photo and bounds the memory a request takes
MAX_PICTURE_PIXELS = 4096 * 4096

# --- pictures over HTTP ----------------------------------------------------------------------


def data_url(image: np.ndarray) -> str:
    """An RGB picture (H, W, 3) uint8 as a PNG ``data:`` URL, the form OpenAI's chat API takes
    a local picture in (``{"type": "image_url", "image_url": {"url": ...}}``)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


#: The picture formats the server decodes (Pillow's names); anything else is refused unread.
PICTURE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


def image_from_data_url(url: str, size: int) -> np.ndarray:
    """The picture of a ``data:image/...;base64,...`` URL as (size, size, 3) uint8 RGB, resized
    when it is another size; anything else (a web link, broken base64, bytes that are no
    picture, an animation, one over ``MAX_PICTURE_PIXELS``) is a ``ValueError`` saying which,
    found from the header before anything is decoded. Links are refused: the server fetches
    nothing.

    >>> from minimind_lib.vision.scenes import make_scene, render
    >>> picture = render(make_scene(0, "held_out", 0))
    >>> bool((image_from_data_url(data_url(picture), 64) == picture).all())
    True
    >>> image_from_data_url("https://example.com/cat.png", 64)
    Traceback (most recent call last):
    ...
    ValueError: image_url must be a data URL (data:image/png;base64,...); this server fetches ...
    """
    from PIL import Image, UnidentifiedImageError

    head, comma, payload = url.partition(",")
    if not (head.startswith("data:image/") and head.endswith(";base64") and comma):
        raise ValueError("image_url must be a data URL (data:image/png;base64,...); this server "
                         "fetches no links")
    try:
        raw = base64.b64decode(payload, validate=True)
    except binascii.Error as e:
        raise ValueError(f"image_url: the base64 data is damaged ({e})") from None
    try:
        with warnings.catch_warnings():  # PIL's own bomb warning: the header check decides
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            # only these decoders: Pillow would hand an EPS to Ghostscript, where installed
            opened = Image.open(io.BytesIO(raw), formats=PICTURE_FORMATS)  # the header only
        with opened:
            _check_header(opened)
            picture = opened.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"image_url: the data is not a picture this server reads (it reads "
                         f"{', '.join(PICTURE_FORMATS)}; {e})") from None
    if picture.size != (size, size):
        picture = picture.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(picture, dtype=np.uint8)


def _check_header(opened) -> None:
    """Refuse, from what the header says, a picture too large or with several frames."""
    width, height = opened.size
    if width * height > MAX_PICTURE_PIXELS:
        raise ValueError(f"image_url: the picture is {width} x {height} pixels, over this "
                         f"server's limit of {MAX_PICTURE_PIXELS:,} pixels; send a smaller one")
    if getattr(opened, "is_animated", False):
        raise ValueError("image_url: an animation (several frames); send one still picture")
