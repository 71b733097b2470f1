"""Installable distribution of shardsmith.

Dataflow workers install the same distribution with ``--setup_file ./setup.py``,
so every module the pipeline imports lives in one of the packages below.
"""

import re

import setuptools

# Read without importing: the packages import TensorFlow and Beam.
with open("schemas/_version.py", encoding="utf-8") as f:
    VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)

# TensorFlow's own dtype package, for the TensorFlow the `cpu` and `gpu` extras pick (TensorFlow
# 2.21 takes >=0.5.1,<1). ml_dtypes 0.7.0 registers its NumPy loops one by one against an
# ever longer list (NumPy's PyUFunc_AddLoop compares with every loop already there, perf
# record): its import costs 1.4-1.9 s of CPU where 0.6.0's costs 0.01 s, in every process that
# imports TensorFlow (the trainer, each conversion worker process, each tf.data service worker):
# `import tensorflow` 7.3 -> 5.8 s of CPU on the development machine.
_ML_DTYPES = "ml_dtypes>=0.5.1,<0.7"

setuptools.setup(
    name="shardsmith",
    version=VERSION,
    description=(
        "Image folders (JPEG, PNG, DICOM, ...) to validated, sharded TFRecord "
        "datasets with Apache Beam, and fast tf.data readers for them."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=["schemas", "imaging", "imaging.formats", "conversion", "conversion.examples", "conversion.targets",
              "beam_jobs", "readers", "readers.targets",
              "shardsmith", "compat"],
    # Upper bounds: the releases shardsmith was tested with. Its compatibility
    # code (compat/) uses private internals of Beam and TensorFlow and checks
    # their versions again when it runs.
    install_requires=[
        # The Dask runner (beam_jobs/_dask.py, compat/beam_internals.py) was
        # written against Beam 2.77.
        "apache-beam>=2.60,<2.78",
        # TensorFlow is required but not installed from here: its CPU-only
        # and GPU builds are different distributions (tensorflow-cpu,
        # tensorflow, tensorflow[and-cuda]) that install the same `tensorflow`
        # package, and pip cannot tell a GPU machine from the others. Forcing
        # one (as `tensorflow-cpu` on every x86_64 machine did) puts a
        # CPU-only build next to a trainer's GPU build. So: bring your own
        # TensorFlow, or pick a flavour with the `cpu` or `gpu` extra (one
        # each, so no install gets two); without any, the first use says so.
        # readers.ResumeCallback subclasses Keras's Callback; TensorFlow >= 2.16
        # depends on Keras 3 already, so this adds nothing to an install.
        "keras>=3",
        "numpy",
        "pillow>=10.1",
        "google-crc32c>=1.5",
        "protobuf",
        # DICOM files are read with pydicom (pure Python); the codecs for
        # compressed DICOM come with the `dicom` extra.
        "pydicom>=3.0,<3.1",
        # TIFF rasters (any band count and sample type, tiles, BigTIFF) are
        # read with tifffile; imagecodecs holds its LZW/deflate/zstd/JPEG codecs.
        "tifffile>=2023.1",
        "imagecodecs>=2023.1",
        # A YOLO data.yaml (--annotations) is read with PyYAML; Apache Beam requires it already.
        "pyyaml>=5.1",
        # --annotation_masks draws COCO polygons and RLE with pycocotools' own rasteriser (what
        # `COCO.annToMask` gives COCO users); imported only when a mask is drawn.
        "pycocotools>=2.0.7",
    ],
    extras_require={
        # A lean CPU-only TensorFlow: CPU machines, Dataflow workers, CI.
        # The pipeline validates every image with TensorFlow's own decoders,
        # the same ops the reader runs, so workers need TensorFlow too.
        "cpu": [
            "tensorflow-cpu>=2.16,<2.22; platform_machine=='x86_64' or platform_machine=='AMD64'",
            # Elsewhere (aarch64, macOS arm64) `tensorflow` is the CPU build.
            "tensorflow>=2.16,<2.22; platform_machine!='x86_64' and platform_machine!='AMD64'",
            _ML_DTYPES,
        ],
        # TensorFlow with GPU support and its CUDA libraries (Linux).
        "gpu": ["tensorflow[and-cuda]>=2.16,<2.22", _ML_DTYPES],
        "dicom": [
            "pylibjpeg>=2.0",
            "pylibjpeg-libjpeg>=2.1",
            "pylibjpeg-openjpeg>=2.3",
            "pylibjpeg-rle>=2.0",
            # NIfTI volumes (--volumes): .nii and .nii.gz, their sform/qform and scaling.
            "nibabel>=5.0",
        ],
        # Beam's Dask runner bound; `--runner DaskRunner` on a dask.distributed cluster.
        "dask": ["dask[distributed]>=2024.4.2"],
        # Real Google Cloud Storage and Dataflow submission.
        "gcp": ["apache-beam[gcp]>=2.60,<2.78"],
        "demo": ["scikit-image>=0.22"],
        "test": [
            "pytest>=8", "psutil", "scikit-image>=0.22", "hypothesis", "tensorflow-datasets>=4.9",
            # `make test` runs the suite on a worker per core (`-n auto --dist loadfile`).
            "pytest-xdist>=3.5",
            "dask[distributed]>=2024.4.2",
            # A GCS emulator on loopback, and the light client Beam's GCS I/O needs.
            "gcp-storage-emulator", "google-cloud-storage>=2.18.2,<4",
            "google-auth-httplib2>=0.1.0,<0.3.0",
            # Reads our index files in a test (without TensorFlow in the process:
            # its bundled example.proto clashes with TensorFlow's). No torch needed.
            "tfrecord>=1.14.6",
            # Writes and reads YOLO labels apart from our reader (pure Python: numpy, rich, tqdm).
            "globox>=2.4",
            # The independent reader of tests/test_imaging_raster_gdal.py: GDAL (its
            # wheel ships it) writes GeoTIFFs in its drivers' layouts and reads them back.
            "rasterio>=1.4",
            # The independent readers of DICOM series (tests/test_imaging_volumes.py):
            # ITK's ImageSeriesReader and dcm2niix (its wheel ships the binary).
            "SimpleITK>=2.3", "dcm2niix",
            # The independent writers and readers of DICOM SEG and RTSTRUCT
            # (tests/test_imaging_dicom_masks.py): highdicom, the standard's reference SEG
            # implementation (pydicom 3); dcmqi, 3D Slicer's SEG writer (its wheel ships the
            # binaries); rt-utils, which traces masks to contours with OpenCV.
            "highdicom>=0.23", "dcmqi>=1.3", "rt-utils>=1.2.7",
        ],
        "bench": ["psutil", "scikit-image>=0.22"],
    },
    entry_points={
        "console_scripts": ["shardsmith=shardsmith.cli:run"],
    },
)
