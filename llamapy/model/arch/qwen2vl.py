"""Qwen2-VL / Qwen2.5-VL text model (``qwen2vl``, llama.cpp's ``src/models/qwen2vl.cpp``): Qwen2 (q/k/v
biases, RMSNorm, SwiGLU) whose rope is M-RoPE: the rotary dim pairs are cut into sections
(``rope.dimension_sections``, e.g. 16/24/24/0) that take the temporal, height and width position of each
token (ggml's ``rope_multi`` with ``GGML_ROPE_TYPE_MROPE``, not interleaved). Text tokens have one
position for all sections; image tokens get (pos0, pos0 + row, pos0 + col) from the batch's 4-section
positions (``llamapy.mtmd``)."""

from __future__ import annotations

from ...ggml import ops
from ..blocks import Rope, SectionRope, rope_for_layer
from ..dense_blocks import DenseArchitecture, DenseLayout
from ..hparams import ROPE_NEOX, HParams, MetaReader, ModelLoadError
from . import register


@register("qwen2vl")
class Qwen2VL(DenseArchitecture):
    layout = DenseLayout(biases=True)

    @classmethod
    def adjust_hparams(cls, hp: HParams, md: MetaReader) -> None:
        hp.rope_type = ROPE_NEOX
        secs = md.raw("rope.dimension_sections")
        if secs is None:
            raise ModelLoadError(f"{md.where}: qwen2vl needs {md.arch}.rope.dimension_sections (M-RoPE)")
        s = tuple(int(x) for x in secs)
        if not 1 <= len(s) <= 4 or min(s) < 0 or not 0 < sum(s) <= hp.n_rot // 2:
            raise ModelLoadError(
                f"{md.where}: {md.arch}.rope.dimension_sections {list(s)} must be up to 4 non-negative "
                f"counts of rotary dim pairs, together 1..{hp.n_rot // 2} (rope.dimension_count {hp.n_rot})"
            )
        hp.rope_sections = s + (0,) * (4 - len(s))

    def layer_rope(self, il: int, n_ctx: int = 0) -> Rope | None:
        r = rope_for_layer(self.hp, il)
        return SectionRope(
            **{k: getattr(r, k) for k in r.__dataclass_fields__},
            sections=self.hp.rope_sections,
            section_mode=ops.ROPE_MROPE,
        )
