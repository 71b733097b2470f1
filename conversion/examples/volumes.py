"""The volume kind (--volumes): a DICOM series (one stack of it) or a NIfTI file, one volume per record.

Its examples are volumes planned from their files' headers
(`conversion.volumes.plan_volumes`): grouped into series units, labelled
and split by unit (never by slice); its records are
`schemas.volumes.VolumeExampleSchema`'s, written by
`conversion.volumes.write_volumes` in the shared worker pool and guard;
`volumes.json` follows the manifest, for the volume tools (issue 36).
"""

from __future__ import annotations

import dataclasses

from conversion import guard
from conversion.examples.kind import ExampleKind, Grouped
from schemas.volumes import VOLUME_MASK_SCHEMA, VOLUME_SCHEMA

__all__ = ["KIND"]


def _volumes():
    """`conversion.volumes`, imported once a conversion of this kind asks: a photo run never loads it."""
    from conversion import volumes

    return volumes


def _applies(validation) -> bool:
    return validation.volumes is not None


def _group(files: list, problems: list, config, appending=None) -> Grouped:
    # Volumes, not files, are planned: each one "file" whose path is its plan's.
    volumes = _volumes()
    masked = config.masks.active
    if masked:
        # Label volumes inside --input_dir are no inputs (`conversion.masks`'s rule for images).
        from conversion import masks as _masks

        files, problems, _ = _masks.drop_masks_dir(files, problems, config.input_dir, config.masks, volumes=True)
    quarantined = guard.Quarantine(guard.quarantine_path(config.output_dir)).load() if config.writing.resume else None
    # With --append (`conversion.append_run.AppendRun`): the dataset's series, which new ones may copy.
    held = None if appending is None else appending.held_volumes()
    planned = volumes.plan_volumes(
        files, problems, config.input_dir, config.output_dir, options=config.validation.volumes,
        split_ratios=config.split_ratios, seed=config.seed, quarantined=quarantined,
        labels_csv=volumes.read_labels_csv(config.labels_csv) if config.labels_csv else None,
        dedup=config.writing.dedup, held=held,
        # With masks a class is optional: class folders only when every volume is at ROOT/<class>/<volume>.
        masked=masked and not config.labels_csv,
        # Each volume's group: its series' headers (read here anyway) or its files' paths.
        group_by=config.group_by)
    if appending is not None:
        appending.found_duplicates(planned.duplicates_of_held)
    members = {name: job.sources for name, job in planned.jobs.items()}
    labels = {name: (job.label, job.split) for name, job in planned.jobs.items()}
    return Grouped(list(planned.files), list(planned.problems), members, planned.jobs, labels, planned.split_source,
                   planned.groups)


def _sized_masks(mask_plan, plans, config):
    # A record holds its mask raw beside its voxels (`schemas.volumes`): shards are sized by both.
    files = _volumes().mask_bytes(mask_plan.files, plans or {}, mask_plan.dtype, config.input_dir)
    return dataclasses.replace(mask_plan, files=tuple(files))


def _finish_plan(plan, grouped: Grouped):
    # A volume is planned as one "file", but the inputs are its files: a problem of a volume
    # (unknown_class, ...) names each, and `num_found` counts each.
    jobs = grouped.plans
    problems = []
    for p in plan.problems:
        job = jobs.get(p.rel_path)
        problems += [p] if job is None else [dataclasses.replace(p, rel_path=rel, message=f"its volume {p.rel_path}: "
                                                                 f"{p.message}") for rel in job.sources]
    extra = sum(len(job.sources) - 1 for job in jobs.values())
    return dataclasses.replace(plan, problems=tuple(problems), num_found=plan.num_found + extra,
                               volumes={f.rel_path: jobs[f.rel_path] for f in plan.files})


def _record_schema(validation, targets: tuple[str, ...] = ()):
    # --masks_dir: each record holds its label volume (`volume/mask`).
    return VOLUME_MASK_SCHEMA if "mask" in targets else VOLUME_SCHEMA


def _write_shard(job):
    return _volumes().write_volumes(job)


def _warm_call(validation, processes: int, decoders: bool = True) -> tuple:
    return _volumes().warm_up, ()


def _manifest_section(plan, config) -> dict:
    return _volumes().manifest_section(plan.volumes, plan, config.validation.volumes)


def _prepare_output(plan, config) -> None:
    # Each volume's plan, which its shard writer reads (its planned file's path).
    _volumes().write_volume_plans(plan.volumes, config.input_dir, config.output_dir)


def _finish_output(manifest, rejects, output_dir: str) -> None:
    # A function of this module, not `conversion.volumes.write_manifest` itself: the row is built
    # without importing it.
    _volumes().write_manifest(manifest, rejects, output_dir)


KIND = ExampleKind(
    name="volume",
    record_noun="volume",
    applies=_applies,
    group=_group,
    record_schema=_record_schema,
    write_shard=_write_shard,
    warm_call=_warm_call,
    sized_masks=_sized_masks,
    finish_plan=_finish_plan,
    manifest_section=_manifest_section,
    prepare_output=_prepare_output,
    finish_output=_finish_output,
)
