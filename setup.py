"""Installable distribution of shardsmith.

Dataflow workers install the same distribution with ``--setup_file ./setup.py``,
so every module the pipeline imports lives in one of the packages below.
"""

import re

import setuptools

# Read without importing: the packages import TensorFlow and Beam.
with open("schemas/_version.py", encoding="utf-8") as f:
    VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)

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
    packages=["schemas", "imaging", "beam_jobs", "readers", "shardsmith"],
    install_requires=[
        "apache-beam>=2.60",
        # The pipeline validates every image with TensorFlow's own decoders,
        # the same ops the reader runs, so TF is a worker dependency too.
        "tensorflow-cpu>=2.16; platform_machine=='x86_64'",
        "tensorflow>=2.16; platform_machine!='x86_64'",
        # readers.ResumeCallback subclasses Keras's Callback; TensorFlow >= 2.16
        # depends on Keras 3 already, so this adds nothing to an install.
        "keras>=3",
        "numpy",
        "pillow>=10.1",
        "google-crc32c>=1.5",
        "protobuf",
        # DICOM files are read with pydicom (pure Python); the codecs for
        # compressed DICOM come with the `dicom` extra.
        "pydicom>=3.0",
    ],
    extras_require={
        "dicom": [
            "pylibjpeg>=2.0",
            "pylibjpeg-libjpeg>=2.1",
            "pylibjpeg-openjpeg>=2.3",
            "pylibjpeg-rle>=2.0",
        ],
        # Beam's Dask runner bound; `--runner DaskRunner` on a dask.distributed cluster.
        "dask": ["dask[distributed]>=2024.4.2"],
        # Real Google Cloud Storage and Dataflow submission.
        "gcp": ["apache-beam[gcp]"],
        "demo": ["scikit-image>=0.22"],
        "test": [
            "pytest>=8", "psutil", "scikit-image>=0.22", "hypothesis", "tensorflow-datasets>=4.9",
            "dask[distributed]>=2024.4.2",
            # A GCS emulator on loopback, and the light client Beam's GCS I/O needs.
            "gcp-storage-emulator", "google-cloud-storage>=2.18.2,<4",
            "google-auth-httplib2>=0.1.0,<0.3.0",
            # Reads our index files in a test (without TensorFlow in the process:
            # its bundled example.proto clashes with TensorFlow's). No torch needed.
            "tfrecord>=1.14.6",
        ],
        "bench": ["psutil", "scikit-image>=0.22"],
    },
    entry_points={
        "console_scripts": ["shardsmith=shardsmith.cli:main"],
    },
)
