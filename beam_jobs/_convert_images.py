"""The whole conversion of a plan as one Beam transform: `ConvertImages` (imported by `beam_jobs.convert`).

Apart from `beam_jobs.convert` so that a local run imports Beam only once it has
planned and started its shard writers (`beam_jobs._startup.early_config`).
"""

from __future__ import annotations

import apache_beam as beam

from beam_jobs._finalize import FinalizeFn
from beam_jobs._shards import ImagesToTFRecords
from beam_jobs._write import WriteShardFn
from conversion import elements, plan as _plan
from conversion.examples import kind_for, record_schema
from conversion.planning import group_section
from conversion.shard_maker import ShardSpec, planned_spec

__all__ = ["ConvertImages"]


class ConvertImages(beam.PTransform):
    """The whole conversion of a plan: shards, rejects, and the manifest last.

    Args:
      plan: The `Plan` of the conversion (labels, splits, shards of each file).
      config: The `ConversionConfig`.
      plan_paths: The shard plan files of `plan` (`conversion.shard_plans.write_shard_plans`).
      spec: The `ShardSpec` every shard is written with (the driver's maker's);
        by default the one `plan` and `config` make, for a run of its own.
      append: With --append, `FinalizeFn`'s `append` (`conversion.append_run.AppendRun.finalize_args`).
    """

    def __init__(self, plan: _plan.Plan, config, plan_paths: list[str],
                 spec: ShardSpec | None = None, append: dict | None = None):
        super().__init__()
        self._plan = plan
        self._config = config
        self._plan_paths = plan_paths
        self._append = append
        spec = spec or planned_spec(ShardSpec(config.output_dir, config.validation), plan, config)
        self._write = ImagesToTFRecords(spec)

    def expand(self, pbegin):
        plan, config = self._plan, self._config
        written = (
            pbegin
            | "ShardPlans" >> beam.Create(self._plan_paths)  # path of a shard's plan
            | "ImagesToTFRecords" >> self._write
        )
        listing_rejects = (
            pbegin
            | "ListingProblems" >> beam.Create(plan.problems, reshuffle=False)
            | "AsRejects" >> beam.Map(elements.problem_to_reject)  # Reject
        )
        rejects = (listing_rejects, written[WriteShardFn.REJECTED]) | "AllRejects" >> beam.Flatten()
        return (
            pbegin
            | "Once" >> beam.Create([None])
            | "WriteManifest" >> beam.ParDo(
                FinalizeFn(
                    output_dir=config.output_dir,
                    class_names=plan.class_names,
                    shard_counts=plan.shard_counts,
                    num_found=plan.num_found,
                    options=config.manifest_options(plan.split_source),
                    max_reject_fraction=config.max_reject_fraction,
                    features=record_schema(config.validation, plan.target_kinds).to_json(),
                    extra={**group_section(plan, config),
                           **kind_for(config.validation).manifest_section(plan, config)},
                    targets=plan.targets_section,
                    append=self._append,
                    finish=kind_for(config.validation).finish_output,
                ),
                shards=beam.pvalue.AsList(written.shards),
                rejects=beam.pvalue.AsList(rejects),
                normalized=beam.pvalue.AsList(written[WriteShardFn.NORMALIZED]),
            )
        )

