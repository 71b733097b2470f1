"""The options of the conversion: its flags, and the config built from them.

`ConvertOptions` declares the flags (Beam's `PipelineOptions`; the flags
themselves are `conversion.flags`'s, which a local run also reads without Beam);
`config_from_options` turns them, once, into `conversion.config.ConversionConfig`
(frozen groups that check themselves). Every default is defined once, in its
group; the flags read it from there.
"""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from conversion.flags import add_flags
from conversion.config import ConversionConfig

__all__ = ["ConvertOptions", "ConversionConfig", "config_from_options"]


class ConvertOptions(PipelineOptions):
    """Command-line options of the conversion (Beam's own options come on top)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        """Declares the flags, group by group (`conversion.flags`)."""
        add_flags(parser)


def config_from_options(options: PipelineOptions) -> ConversionConfig:
    """Builds the conversion's config, and each group of it, once from the flags.

    Raises:
      ValueError: For the first bad flag, naming it.
    """
    return ConversionConfig.from_flags(options.view_as(ConvertOptions))
