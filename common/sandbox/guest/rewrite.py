"""What Thyme's evaluation does to model-written code before it runs it.

The SpecEyes evaluation (``eval_code_thyme/sandbox.py``) edits the code first; a model
trained and evaluated that way expects it, so the edits are reproduced, in its order:

1. the first non-blank line takes the indentation of the second when they differ;
2. the code is dedented, stripped and formatted by autopep8 (aggressive level 2);
3. ``image_path = "<literal>"`` naming no existing image file is pointed at the input;
4. literal crop boxes are clamped to the image and widened to a smallest side
   (``x1, y1, x2, y2 = (...)`` with a coordinate-like name among the targets, or
   ``crop_box = (...)`` and the like); slices of the image are left alone (the
   evaluation's rule for them never matches on Python 3.9+);
5. ``cv.``, ``cv3.``, ``cv4.``, ``CV.`` become ``cv2.``;
6. folders implied by quoted output paths are made, and ``{x:.Nf}`` formats print 8
   decimals.

Every step that fails (a syntax error, autopep8 missing) leaves the code as it was.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import textwrap

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".tiff", ".webp")
BOX_NAMES = frozenset(
    {
        "crop_box",
        "bbox",
        "box",
        "coordinates",
        "coords",
        "crop_coords",
        "left_crop_coords",
        "right_crop_coords",
        "top_crop_coords",
        "bottom_crop_coords",
    }
)
CORNER_NAMES = frozenset({"x1", "y1", "x2", "y2", "left", "top", "right", "bottom"})
CV_ALIASES = frozenset({"cv", "cv4", "cv3", "CV"})


def rewrite(
    code: str,
    image_path: str,
    size: tuple[int, int] | None,
    *,
    model_output_dir: str,
    output_dir: str,
    min_side: int,
) -> str:
    """The code as the evaluation would run it (steps 1-6 above); ``model_output_dir`` (the
    folder the model was trained to write to) is replaced by ``output_dir``."""
    code = _align_first_line(code)
    code = _autopep8(textwrap.dedent(code).strip())
    code = _transform(code, _ImagePath(image_path))
    if size is not None:
        code = _transform(code, _ClampBoxes(size[0], size[1], min_side))
    code = _transform(code, _OpenCvName())
    _make_output_folders(code, model_output_dir, output_dir)
    code = code.replace(model_output_dir, output_dir.rstrip("/") + "/")
    return re.sub(r":\.\d{1}f}", ":.8f}", code)


def _align_first_line(code: str) -> str:
    lines = code.splitlines()
    filled = [index for index, line in enumerate(lines) if line.strip()][:2]
    if len(filled) < 2:
        return code
    first, second = (lines[index] for index in filled)
    indent = second[: len(second) - len(second.lstrip(" "))]
    if first[: len(first) - len(first.lstrip(" "))] != indent:
        lines[filled[0]] = indent + first.lstrip(" ")
    return "\n".join(lines)


def _autopep8(code: str) -> str:
    try:
        import autopep8

        return str(autopep8.fix_code(code, options={"aggressive": 2}))
    except Exception:  # the evaluation runs the code unformatted then
        return code


class _Rewriter(ast.NodeTransformer):
    changed = False


def _transform(code: str, rewriter: _Rewriter) -> str:
    try:
        tree = rewriter.visit(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code
    return ast.unparse(tree) if rewriter.changed else code


class _ImagePath(_Rewriter):
    def __init__(self, image_path: str) -> None:
        self.image_path = image_path

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        target, value = node.targets[0], node.value
        if (
            len(node.targets) == 1
            and isinstance(target, ast.Name)
            and target.id == "image_path"
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
            and not _is_image_file(value.value)
        ):
            node.value = ast.Constant(self.image_path)
            self.changed = True
        return self.generic_visit(node)


def _is_image_file(path: str) -> bool:
    return os.path.isfile(path) and path.lower().endswith(IMAGE_SUFFIXES)


class _ClampBoxes(_Rewriter):
    def __init__(self, width: int, height: int, min_side: int) -> None:
        self.width, self.height, self.min_side = float(width), float(height), min_side

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        target, value = node.targets[0], node.value
        single = len(node.targets) == 1
        if (
            single
            and isinstance(target, ast.Tuple)
            and len(target.elts) == 4
            and all(isinstance(name, ast.Name) for name in target.elts)
            and isinstance(value, ast.Tuple)
            and len(value.elts) == 4
        ):
            names = {name.id.lower() for name in target.elts if isinstance(name, ast.Name)}
            if names & CORNER_NAMES:
                self._clamp(value)
        elif (
            single
            and isinstance(target, ast.Name)
            and target.id in BOX_NAMES
            and isinstance(value, ast.Tuple)
            and len(value.elts) == 4
        ):
            self._clamp(value)
        return self.generic_visit(node)

    def _clamp(self, box: ast.Tuple) -> None:
        raw = [_number(element) for element in box.elts]
        if any(value is None for value in raw):
            return
        x1, y1, x2, y2 = (float(value) for value in raw if value is not None)
        clamped = clamp_box(x1, y1, x2, y2, self.width, self.height, self.min_side)
        if [round(v) for v in clamped] != [round(float(v or 0)) for v in raw]:
            box.elts = [ast.Constant(round(v)) for v in clamped]
            self.changed = True


def _number(node: ast.expr) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    return None


def clamp_box(
    x1: float, y1: float, x2: float, y2: float, width: float, height: float, min_side: int
) -> list[float]:
    """The evaluation's clamp: sorted, inside the image, at least ``min_side`` a side (or
    the whole side when the image is smaller), never empty."""
    left, right = _clamp_axis(min(x1, x2), max(x1, x2), width, min_side)
    top, bottom = _clamp_axis(min(y1, y2), max(y1, y2), height, min_side)
    return [left, top, right, bottom]


def _clamp_axis(low: float, high: float, size: float, min_side: int) -> tuple[float, float]:
    low = min(max(0.0, low), size - 1.0 if size > 0 else 0.0)
    high = min(max(0.0, high), size)
    if low >= high and size > 0:
        low = max(0.0, high - 1.0)
        if high <= low:
            high = min(size, low + 1.0)
    if size > 0 and high - low < min_side:
        if size < min_side:
            low, high = 0.0, size
        else:
            high = low + min_side
            if high > size:
                high = size
                low = max(0.0, high - min_side)
    if size > 0 and low >= high:
        high = min(size, low + 1.0)
    return low, high


class _OpenCvName(_Rewriter):
    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id in CV_ALIASES:
            node.value.id = "cv2"
            self.changed = True
        return self.generic_visit(node)


def _make_output_folders(code: str, model_output_dir: str, output_dir: str) -> None:
    quoted = re.compile(r"(['\"])(" + re.escape(model_output_dir) + r"[^'\"]*)\1")
    for match in quoted.finditer(code):
        folder = os.path.dirname(match.group(2)[len(model_output_dir) :].replace(" ", ""))
        if folder:  # on failure, the code's own save will say what is wrong
            with contextlib.suppress(OSError):
                os.makedirs(os.path.join(output_dir, folder), exist_ok=True)
