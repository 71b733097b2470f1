"""DICOM files to PNG images, shown the way a radiologist's viewer shows them.

A DICOM file stores raw detector values plus the instructions for displaying
them; storing the raw values would give a model a different picture from the
one a person reads. Each frame is therefore rendered through the DICOM
greyscale pipeline (PS3.3 C.11, PS3.4 N.2):

1. Modality LUT: Rescale Slope/Intercept (e.g. CT values to Hounsfield units)
   or a Modality LUT Sequence.
2. VOI: the window chosen, in order, from `DicomOptions.window` (the user's
   --dicom_window), the file's Window Center/Width (the first pair when there
   are several), the file's VOI LUT Sequence (first LUT), or else the image's
   own minimum and maximum.
3. MONOCHROME1 images (where 0 is white) are inverted after windowing.
4. The windowed values, 0..1, are scaled to 0..255 (8-bit PNG) or 0..65535
   (16-bit PNG) and rounded half up.

Colour images (RGB, YBR_*, PALETTE COLOR) become 8-bit RGB PNGs without
windowing. What was applied is returned as `DicomFrame.provenance`, so a
dataset records how each pixel came to be.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import struct
import threading
import warnings
import zlib
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from imaging.errors import ImageRejected

if TYPE_CHECKING:
    from pydicom import uid as dicom_uid
    from pydicom.dataset import Dataset

__all__ = [
    "SEGMENTATION_SOP_CLASSES",
    "check_not_segmentation",
    "is_keyword",
    "header_value",
    "IDENTIFYING_TAGS",
    "DicomOptions",
    "DicomFrame",
    "is_dicom",
    "decode_dicom",
    "read_group_value",
    "parse_window",
    "describe_available_codecs",
    "read_dataset",
    "read_header",
    "native_pixel_offset",
    "dataset_pixel_offset",
    "decode_native_frame",
    "frame_value",
    "num_frames",
    "decode_stored_frame",
]

_LOG = logging.getLogger(__name__)

# The same default as --max_pixels (Pillow's decompression-bomb error limit);
# the pipeline passes the user's value.
_DEFAULT_MAX_PIXELS = 178_956_970

# Attributes that identify a patient, or can be joined with other records to
# do so: the DICOM PS3.15 Annex E Basic Application Level Confidentiality
# Profile (Table E.1-1) for names, IDs, addresses, dates and times, UIDs,
# institutions, staff, devices and free text (descriptions and comments can
# hold anything an operator typed, names included). PatientAge, PatientSex,
# PatientSize and PatientWeight are not listed: PS3.15's "Retain Patient
# Characteristics" option keeps them, and they are common model covariates.
# Storing any of these needs --dicom_allow_identifying_tags; grouping splits
# by PatientID (`read_group_value`) does not store the value.
IDENTIFYING_TAGS: frozenset[str] = frozenset({
    # Patient identity and demographics.
    "PatientName", "PatientID", "IssuerOfPatientID", "OtherPatientIDs",
    "OtherPatientIDsSequence", "OtherPatientNames", "PatientBirthName",
    "PatientMotherBirthName", "PatientBirthDate", "PatientBirthTime",
    "PatientAddress", "PatientTelephoneNumbers", "PatientTelecomInformation",
    "CountryOfResidence", "RegionOfResidence", "MilitaryRank", "BranchOfService",
    "MedicalRecordLocator", "Occupation", "EthnicGroup", "PatientReligiousPreference",
    "ResponsiblePerson", "ResponsibleOrganization", "PatientInsurancePlanCodeSequence",
    "PatientComments", "AdditionalPatientHistory", "MedicalAlerts", "Allergies",
    "LastMenstrualDate", "PatientState", "SpecialNeeds",
    # Visit, order and study identifiers.
    "AccessionNumber", "StudyID", "AdmissionID", "IssuerOfAdmissionIDSequence",
    "AdmittingDiagnosesDescription", "RequestedProcedureID", "ScheduledProcedureStepID",
    "PerformedProcedureStepID", "RequestAttributesSequence",
    # UIDs: unique per study/series/instance, so they link back to the source.
    "StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "FrameOfReferenceUID",
    "MediaStorageSOPInstanceUID", "ReferencedSOPInstanceUID", "InstanceCreatorUID",
    "IrradiationEventUID", "SynchronizationFrameOfReferenceUID", "StorageMediaFileSetUID",
    # Dates and times of the examination.
    "StudyDate", "SeriesDate", "AcquisitionDate", "ContentDate", "AcquisitionDateTime",
    "StudyTime", "SeriesTime", "AcquisitionTime", "ContentTime",
    "InstanceCreationDate", "InstanceCreationTime",
    "PerformedProcedureStepStartDate", "PerformedProcedureStepStartTime",
    # Institutions, staff and devices.
    "InstitutionName", "InstitutionAddress", "InstitutionalDepartmentName",
    "InstitutionCodeSequence", "ReferringPhysicianName", "ReferringPhysicianAddress",
    "ReferringPhysicianTelephoneNumbers", "PhysiciansOfRecord", "PerformingPhysicianName",
    "NameOfPhysiciansReadingStudy", "RequestingPhysician", "OperatorsName",
    "StationName", "DeviceSerialNumber", "DetectorID", "PlateID",
    # Free text.
    "StudyDescription", "SeriesDescription", "ImageComments", "StudyComments",
    "RequestedProcedureDescription", "PerformedProcedureStepDescription",
    "DerivationDescription", "TextValue",
})

_FRAMES = ("first", "middle", "all")
_BIT_DEPTHS = (8, 16)

# VRs that hold binary data or nested datasets: not meaningful as strings.
_NON_STRING_VRS = frozenset({"SQ", "OB", "OD", "OF", "OL", "OV", "OW", "UN"})

# The decoding plugin of pydicom that shardsmith[dicom] provides.
_PREFERRED_PLUGIN = "pylibjpeg"
# What shardsmith[dicom] installs to decode each family of compressed syntax;
# named in unsupported_codec messages.
_LIBJPEG = "pylibjpeg pylibjpeg-libjpeg"
_OPENJPEG = "pylibjpeg pylibjpeg-openjpeg"

# pydicom is imported on first use (`_load_pydicom`), not with this module:
# ~0.25 s of CPU (its pixel decoders, `requests` for its data manager) that
# every conversion's driver and worker processes paid at start-up, DICOM
# files or not (they import `imaging` for its options and validator). These
# names are pydicom's, bound by `_load_pydicom`: every function that uses one
# calls it first, or is only called from one that has.
_LOADED = False
_LOAD_LOCK = threading.Lock()
# The transfer syntax UIDs of the codec packages (`_CODEC_PACKAGES`), of JPEG 2000
# (`_J2K_SYNTAXES`), and the errors below (`_PYDICOM_ERRORS`, `_DECODER_ERRORS`).
_CODEC_PACKAGES: dict = {}
_J2K_SYNTAXES: frozenset = frozenset()
# pydicom raises these for damaged files (found by truncating and corrupting
# every bundled test file): InvalidDicomError for a bad header; OSError ("No
# tag to read at file position", the data is in memory so it is never I/O)
# and struct.error for truncation; BytesLengthException for a value whose
# length does not fit its VR; ValueError (UnicodeDecodeError included) for
# unparsable values and pixel data of the wrong length; NotImplementedError
# for layouts it does not handle; zlib.error for damaged deflated data.
# Generic errors (AttributeError, TypeError, RuntimeError) are not among them:
# raised by shardsmith's own code they are bugs, not damaged files.
_PYDICOM_ERRORS: tuple = ()
# Around pydicom's pixel decoder call only, two generic errors are the
# decoder's own: RuntimeError when every plugin failed ("Unable to decode as
# exceptions were raised by all available plugins"; the Rust decoders' panic
# becomes one too) and AttributeError when its validation finds a damaged or
# missing image element ("Missing required element: (0028,0103) 'Pixel
# Representation'", found by corrupting pydicom's bundled files). Anywhere
# else they are a bug in shardsmith, and propagate.
_DECODER_ERRORS: tuple = ()


def _load_pydicom() -> None:
    """Imports pydicom and binds its names in this module, once (see `_LOADED`)."""
    global _LOADED, pydicom, dicom_uid, dictionary_has_tag, dictionary_VR, tag_for_keyword, Dataset
    global FileMetaDataset, MultiValue, apply_color_lut, apply_modality_lut, convert_color_space, get_decoder
    global _CODEC_PACKAGES, _J2K_SYNTAXES, _PYDICOM_ERRORS, _DECODER_ERRORS
    if _LOADED:
        return
    with _LOAD_LOCK:
        if _LOADED:
            return
        import pydicom
        from pydicom import uid as dicom_uid
        from pydicom.datadict import dictionary_has_tag, dictionary_VR, tag_for_keyword
        from pydicom.dataset import Dataset, FileMetaDataset
        from pydicom.errors import BytesLengthException, InvalidDicomError
        from pydicom.multival import MultiValue
        from pydicom.pixels import apply_color_lut, apply_modality_lut, convert_color_space, get_decoder

        _CODEC_PACKAGES = {
            dicom_uid.JPEGBaseline8Bit: _LIBJPEG,
            dicom_uid.JPEGExtended12Bit: _LIBJPEG,
            dicom_uid.JPEGLossless: _LIBJPEG,
            dicom_uid.JPEGLosslessSV1: _LIBJPEG,
            dicom_uid.JPEGLSLossless: _LIBJPEG,
            dicom_uid.JPEGLSNearLossless: _LIBJPEG,
            dicom_uid.JPEG2000Lossless: _OPENJPEG,
            dicom_uid.JPEG2000: _OPENJPEG,
            dicom_uid.HTJ2KLossless: _OPENJPEG,
            dicom_uid.HTJ2KLosslessRPCL: _OPENJPEG,
            dicom_uid.HTJ2K: _OPENJPEG,
            # pydicom decodes RLE itself; pylibjpeg-rle is only faster.
            dicom_uid.RLELossless: "pylibjpeg pylibjpeg-rle",
        }
        _J2K_SYNTAXES = frozenset({
            dicom_uid.JPEG2000Lossless, dicom_uid.JPEG2000, dicom_uid.HTJ2KLossless,
            dicom_uid.HTJ2KLosslessRPCL, dicom_uid.HTJ2K,
        })
        _PYDICOM_ERRORS = (
            InvalidDicomError, BytesLengthException, OSError, struct.error, zlib.error, ValueError,
            NotImplementedError,
        )
        _DECODER_ERRORS = (*_PYDICOM_ERRORS, RuntimeError, AttributeError)
        _LOADED = True


# Photometric interpretations.
_MONOCHROME = ("MONOCHROME1", "MONOCHROME2")
_YBR_TO_CONVERT = ("YBR_FULL", "YBR_FULL_422")
_PALETTE = "PALETTE COLOR"

# A JP2 file's first box: length 12, type 'jP  ' (ISO/IEC 15444-1 I.5.1).
_JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  "

# The elements every image needs before its pixels can be decoded.
_IMAGE_PIXEL_ELEMENTS = ("Rows", "Columns", "BitsAllocated", "PhotometricInterpretation")
_PIXEL_KEYWORDS = ("PixelData", "FloatPixelData", "DoubleFloatPixelData")

# Valid explicit VR codes, for recognising a dataset that has no preamble.
_VRS = frozenset(
    b"AE AS AT CS DA DS DT FD FL IS LO LT OB OD OF OL OV OW PN SH SL SQ SS ST SV TM "
    b"UC UI UL UN UR US UT UV".split()
)
# Explicit VRs whose length is 4 bytes after 2 reserved bytes (PS3.5 7.1.2).
_LONG_VRS = frozenset(b"OB OD OF OL OV OW SQ SV UC UN UR UT UV".split())
# The first element of a bare dataset: File Meta (0002) or Identifying (0008)
# group, which start nearly every dataset, with a short value (a character
# set, an image type, a UID).
_BARE_FIRST_GROUPS = (0x0002, 0x0008)
_BARE_MAX_FIRST_LENGTH = 256
_UNDEFINED_LENGTH = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class DicomOptions:
    """How DICOM files are rendered; validated when built.

    Attributes:
      window: (center, width) applied to every greyscale image instead of the
        file's own window (--dicom_window 40,400). None uses the file's.
      bit_depth: 8 or 16 bits per greyscale PNG sample (--dicom_bit_depth).
        Colour images are always 8-bit RGB.
      frames: Which frames of a multi-frame file to keep: 'first', 'middle'
        (index n // 2) or 'all' (one image per frame) (--dicom_frames).
      tags: DICOM keywords (e.g. 'Modality', 'BodyPartExamined') whose values
        are returned as strings (--dicom_tags).
      allow_identifying_tags: Permit keywords of `IDENTIFYING_TAGS` in `tags`
        (--dicom_allow_identifying_tags).
      max_pixels: Files whose decoded frames hold more pixels in total
        (rows * columns * frames kept) are rejected as 'too_large' before any
        pixel is decoded (--max_pixels).

    Raises:
      ValueError: Naming the flag, what it allows and what it received.
    """

    window: tuple[float, float] | None = None
    bit_depth: int = 8
    frames: str = "first"
    tags: tuple[str, ...] = ()
    allow_identifying_tags: bool = False
    max_pixels: int = _DEFAULT_MAX_PIXELS

    def __post_init__(self):
        if self.window is not None:
            window = tuple(self.window)
            if len(window) != 2 or not all(_is_real(v) for v in window):
                raise ValueError(
                    f"--dicom_window must be two numbers CENTER,WIDTH. Received: {self.window!r}"
                )
            center, width = float(window[0]), float(window[1])
            if not (math.isfinite(center) and math.isfinite(width)) or width < 1:
                # PS3.3 C.11.2.1.2: a linear window is at least 1 wide.
                raise ValueError(
                    "--dicom_window must be finite with a width of at least 1. "
                    f"Received: center={center:g}, width={width:g}"
                )
            object.__setattr__(self, "window", (center, width))
        if self.bit_depth not in _BIT_DEPTHS or isinstance(self.bit_depth, bool):
            raise ValueError(f"--dicom_bit_depth must be 8 or 16. Received: {self.bit_depth!r}")
        if self.frames not in _FRAMES:
            raise ValueError(
                f"--dicom_frames must be one of {', '.join(_FRAMES)}. Received: {self.frames!r}"
            )
        if isinstance(self.tags, str):
            raise ValueError(
                f"--dicom_tags must be a sequence of DICOM keywords. Received the string {self.tags!r}"
            )
        tags = tuple(self.tags)
        object.__setattr__(self, "tags", tags)
        for keyword in tags:
            _check_keyword(keyword, "--dicom_tags")
        dupes = sorted({k for k in tags if tags.count(k) > 1})
        if dupes:
            raise ValueError(f"--dicom_tags must not repeat a keyword. Received {dupes} twice")
        refused = sorted(set(tags) & IDENTIFYING_TAGS)
        if refused and not self.allow_identifying_tags:
            raise ValueError(
                f"--dicom_tags {', '.join(refused)} can identify a patient (DICOM PS3.15 "
                "basic profile) and would be stored in every record; pass "
                "--dicom_allow_identifying_tags to store them anyway."
            )
        if isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"--max_pixels must be an integer of at least 1. Received: {self.max_pixels!r}")


@dataclasses.dataclass(frozen=True)
class DicomFrame:
    """One rendered frame of a DICOM file.

    Attributes:
      png: The PNG bytes: 8-bit grey, 16-bit grey or 8-bit RGB.
      height, width: Size in pixels.
      channels: 1 (grey) or 3 (RGB).
      frame: Index of the frame within a multi-frame file; None for a file
        with one frame.
      num_frames: Number of frames in the file.
      tags: The requested `DicomOptions.tags`, as strings ('' when absent;
        values of multi-valued elements joined with a backslash, as in DICOM).
      provenance: What was applied, JSON-serialisable:
        rescale: {'slope', 'intercept'} or None (no Rescale elements);
        modality_lut: True when a Modality LUT Sequence was applied instead;
        window: {'center', 'width', 'function', 'source'} or None for colour
          images; source is 'cli', 'file', 'file_first_of_n' (the file lists
          several windows, the first was used), 'voi_lut' (center and width
          None) or 'min_max' (the frame's own range);
        inverted: True for MONOCHROME1;
        bit_depth: 8 or 16, of the PNG; bit_depth_requested when it differs
          (colour images are 8-bit);
        photometric: The file's Photometric Interpretation;
        color_conversion: e.g. 'YBR_FULL->RGB', 'PALETTE COLOR->RGB', or
          'YBR_RCT->RGB (decoder)'; None when none was needed;
        transfer_syntax: The Transfer Syntax UID (transfer_syntax_inferred
          is True when the file had none and it was deduced from the
          encoding).
    """

    png: bytes
    height: int
    width: int
    channels: int
    frame: int | None
    num_frames: int
    tags: dict[str, str]
    provenance: dict


def parse_window(text: str) -> tuple[float, float]:
    """Parses --dicom_window 'CENTER,WIDTH', e.g. '40,400' (a CT soft-tissue window).

    Raises:
      ValueError: When the text is not two numbers separated by a comma.
    """
    parts = [p.strip() for p in str(text).split(",")]
    try:
        if len(parts) != 2:
            raise ValueError
        center, width = float(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(
            f"--dicom_window must be CENTER,WIDTH, e.g. 40,400. Received: {text!r}"
        ) from None
    # DicomOptions checks the values themselves.
    return center, width


def describe_available_codecs() -> dict[str, bool]:
    """Which compressed transfer syntaxes shardsmith[dicom]'s decoders can read here.

    Returns:
      {transfer syntax name: True when the pylibjpeg decoder for it is
      installed} for every compressed syntax pydicom knows; RLE is always
      True (pydicom decodes it itself).
    """
    _load_pydicom()
    out = {}
    for ts in _CODEC_PACKAGES:
        try:
            decoder = get_decoder(ts)
        except NotImplementedError:
            out[ts.name] = False
            continue
        if ts == dicom_uid.RLELossless:
            out[ts.name] = decoder.is_available
        else:
            out[ts.name] = _PREFERRED_PLUGIN in decoder.available_plugins
    return out


def is_dicom(head: bytes) -> bool:
    """Whether bytes start a DICOM file.

    True for the DICOM file format ('DICM' after the 128-byte preamble) and
    for a bare dataset without preamble or File Meta (as some old archives
    and treatment planning systems write): its first element must belong to
    group 0002 or 0008 with a tag pydicom knows, a plausible even length, and
    the elements that follow within `head` must be in ascending order. JPEG,
    PNG and text can never pass: they do not start with the bytes 00 08,
    08 00, 00 02 or 02 00.

    Args:
      head: The first bytes of the file; 132 suffice, a few hundred make the
        bare-dataset check firmer.
    """
    head = bytes(head)
    if len(head) >= 132 and head[128:132] == b"DICM":
        return True
    return _is_bare_dataset(head, "<") or _is_bare_dataset(head, ">")


def _is_bare_dataset(head: bytes, endian: str) -> bool:
    """Walks the first elements of `head` as a dataset with the given byte order."""
    if len(head) < 8:
        return False
    group, element = struct.unpack_from(endian + "HH", head, 0)
    if group not in _BARE_FIRST_GROUPS:
        return False  # Most files (JPEG, PNG, TIFF): told apart without pydicom.
    _load_pydicom()
    if not dictionary_has_tag((group << 16) | element):
        return False
    explicit = head[4:6] in _VRS
    previous = -1
    pos = 0
    walked = 0
    while pos + 8 <= len(head) and walked < 4:
        group, element = struct.unpack_from(endian + "HH", head, pos)
        tag = (group << 16) | element
        if tag <= previous:
            return False
        vr = head[pos + 4:pos + 6]
        if explicit:
            if vr not in _VRS:
                return False
            if vr in _LONG_VRS:
                if pos + 12 > len(head):
                    break
                (length,) = struct.unpack_from(endian + "I", head, pos + 8)
                header = 12
            else:
                (length,) = struct.unpack_from(endian + "H", head, pos + 6)
                header = 8
        else:
            (length,) = struct.unpack_from(endian + "I", head, pos + 4)
            header = 8
        if walked == 0 and (length > _BARE_MAX_FIRST_LENGTH or length % 2):
            return False
        if length == _UNDEFINED_LENGTH:
            # A sequence of undefined length: nothing more to check cheaply.
            break
        previous = tag
        pos += header + length
        walked += 1
    return walked > 0


def read_group_value(data: bytes, keyword: str) -> str | None:
    """Reads one header value, e.g. PatientID or StudyInstanceUID, to group splits by.

    Only the header is parsed (pixels are never read).

    Args:
      data: The file's bytes (the header part is enough).
      keyword: A DICOM keyword.

    Returns:
      The value as a string (multiple values joined with a backslash), or
      None when the element is absent or empty, or the bytes are not a
      readable DICOM header (`decode_dicom` then rejects the file with the
      reason).

    Raises:
      ValueError: When `keyword` is not a DICOM keyword.
    """
    _load_pydicom()
    _check_keyword(keyword, "keyword")
    if not is_dicom(data[:1024]):
        return None
    with warnings.catch_warnings():
        # pydicom warns (and logs) about every non-conformant value.
        warnings.simplefilter("ignore")
        try:
            ds = pydicom.dcmread(
                io.BytesIO(data), force=True, stop_before_pixels=True, specific_tags=[keyword]
            )
            value = _tag_string(ds, keyword)
        except _PYDICOM_ERRORS as e:
            _LOG.debug("Cannot read %s from a DICOM header: %s", keyword, e)
            return None
    return value or None


def header_value(ds: Dataset, keyword: str) -> str | None:
    """One value of a parsed header as `read_group_value` reads it from bytes; None when absent or empty.

    For a header parsed already (the volume path's planning): --group_by's value
    without reading the file again.
    """
    return _tag_string(ds, keyword) or None


def decode_dicom(data: bytes, name: str, options: DicomOptions) -> list[DicomFrame]:
    """Renders a DICOM file's frames to PNG.

    Args:
      data: The whole file.
      name: Its relative path, for messages.
      options: How to render.

    Returns:
      One frame, or every frame with `options.frames == 'all'`.

    Raises:
      ImageRejected: 'not_an_image' (not DICOM), 'no_pixel_data' (reports,
        plans, structure sets, directories, waveforms), 'unsupported_codec'
        (the decoder for its compression is not installed, or the
        photometric interpretation is not supported), 'too_large', or
        'corrupt' (truncated, damaged or inconsistent).
    """
    _load_pydicom()
    if not is_dicom(data[:1024]):
        raise ImageRejected("not_an_image", f"{name} is not a DICOM file")
    with warnings.catch_warnings(record=True) as caught:
        # pydicom warns (and logs) about every non-conformant value; a
        # conversion of many files would drown in them.
        warnings.simplefilter("always")
        try:
            return _decode(data, name, options)
        except ImageRejected:
            raise
        except Exception as e:
            # Not a damaged file (those are rejected above): a bug, which
            # fails the conversion; the note says which file set it off.
            if hasattr(e, "add_note"):  # Python >= 3.11
                e.add_note(f"while decoding the DICOM file {name}")
            raise
        finally:
            if caught:
                _LOG.debug("%s: %d pydicom warning(s), first: %s", name, len(caught), caught[0].message)


def _decode(data: bytes, name: str, options: DicomOptions) -> list[DicomFrame]:
    try:
        ds = pydicom.dcmread(io.BytesIO(data), force=True)
    except _PYDICOM_ERRORS as e:
        raise ImageRejected("corrupt", f"{name}: unreadable DICOM header ({_short(e)})") from e
    try:
        keyword = next((k for k in _PIXEL_KEYWORDS if k in ds), None)
        if keyword is None:
            sop = _sop_class_name(ds)
            raise ImageRejected(
                "no_pixel_data", f"{name} is a DICOM {sop} without pixel data" if sop
                else f"{name} is a DICOM file without pixel data",
            )
        pixel_bytes = ds[keyword].value
        if not isinstance(pixel_bytes, (bytes, bytearray)) or not pixel_bytes:
            # Length 0, or a VR changed to one pydicom reads as numbers (US):
            # its decoder would fail on them with a TypeError (issue 39).
            raise ImageRejected(
                "corrupt", f"{name}: its {keyword} element (VR {ds[keyword].VR}) holds no pixel bytes"
            )
        missing = [k for k in _IMAGE_PIXEL_ELEMENTS if ds.get(k) in (None, "")]
        if missing:
            raise ImageRejected(
                "corrupt", f"{name} has pixel data but lacks {', '.join(missing)} to decode it"
            )
        ts, inferred = _transfer_syntax(ds, name)
        rows, cols = int(ds.Rows), int(ds.Columns)
        if rows < 1 or cols < 1:
            raise ImageRejected("corrupt", f"{name} has an empty size {cols}x{rows}")
        num_frames = _num_frames(ds, name)
        indices = _frame_indices(num_frames, options.frames)
        pixels = rows * cols * len(indices)
        if pixels > options.max_pixels:
            raise ImageRejected(
                "too_large",
                f"{name} is {cols}x{rows} x {len(indices)} frame(s) = {pixels:,} pixels, more "
                f"than --max_pixels={options.max_pixels:,}",
            )
        decoder = _decoder_for(ts, name)
        if ts in _J2K_SYNTAXES:
            _check_jp2_boxes(ds.PixelData, name)
        elif _CODEC_PACKAGES.get(ts) == _LIBJPEG:
            _check_jpeg_frame_headers(ds.PixelData, rows, cols, name)
        tags = {k: _tag_string(ds, k) for k in options.tags}
        photometric = str(ds.PhotometricInterpretation).strip().upper()
        base = {
            "photometric": photometric,
            "transfer_syntax": str(ts),
        }
        if inferred:
            base["transfer_syntax_inferred"] = True
        frames = []
        for index in indices:
            arr, meta = _decode_frame(decoder, ds, index, name)
            provenance = dict(base)
            pixels_out, channels = _render(arr, meta, ds, index, options, photometric, provenance, name)
            frames.append(DicomFrame(
                png=_encode_png(pixels_out),
                height=int(pixels_out.shape[0]),
                width=int(pixels_out.shape[1]),
                channels=channels,
                frame=None if num_frames == 1 else index,
                num_frames=num_frames,
                tags=dict(tags),
                provenance=provenance,
            ))
        return frames
    except _PYDICOM_ERRORS as e:
        # Values are parsed lazily, so a damaged header can surface anywhere.
        raise ImageRejected("corrupt", f"{name}: {_short(e)}") from e


def _transfer_syntax(ds: Dataset, name: str) -> tuple[dicom_uid.UID, bool]:
    """The file's Transfer Syntax UID, deduced from the encoding if it has none."""
    meta = getattr(ds, "file_meta", None)
    ts = meta.get("TransferSyntaxUID") if meta is not None else None
    if ts:
        return dicom_uid.UID(str(ts)), False
    implicit, little = ds.original_encoding
    if implicit is None or little is None or (implicit and not little):
        raise ImageRejected("corrupt", f"{name} has no Transfer Syntax UID and an unknown encoding")
    # Bare datasets (no File Meta) can only be natively encoded: encapsulated
    # pixel data needs a Transfer Syntax UID to name its codec.
    if implicit:
        ts = dicom_uid.ImplicitVRLittleEndian
    else:
        ts = dicom_uid.ExplicitVRLittleEndian if little else dicom_uid.ExplicitVRBigEndian
    if meta is None:
        ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ts
    return ts, True


def _decoder_for(ts: dicom_uid.UID, name: str):
    try:
        decoder = get_decoder(ts)
    except NotImplementedError:
        raise ImageRejected(
            "unsupported_codec",
            f"{name} uses transfer syntax {ts.name} ({ts}), which pydicom cannot decode",
        ) from None
    if not decoder.is_available:
        raise ImageRejected(
            "unsupported_codec",
            f"{name} uses {ts.name}, which no installed decoder reads; {_install_hint(ts)}",
        )
    return decoder


def _check_jp2_boxes(pixel_data: bytes, name: str) -> None:
    """Rejects JP2-wrapped frames whose box walk would never end.

    pydicom 3.0 reads a frame's JP2 header (`get_j2k_parameters`) by hopping
    from box to box by each box's length until the codestream box; a box of
    length 0 that is not the codestream makes it loop forever, hanging the
    worker. The same walk is done here, over the whole Pixel Data (a
    superset of each frame), and stops at the first such box.
    """
    start = pixel_data.find(_JP2_SIGNATURE)
    while start != -1:
        offset = start + 12  # After the 12-byte signature box, as pydicom walks.
        while offset < len(pixel_data):
            length = int.from_bytes(pixel_data[offset:offset + 4], "big")
            if pixel_data[offset + 4:offset + 8] == b"jp2c":
                break
            if length == 0:
                raise ImageRejected(
                    "corrupt", f"{name}: a JPEG 2000 (JP2) header box has length 0 before the codestream"
                )
            offset += length
        start = pixel_data.find(_JP2_SIGNATURE, start + 1)


# Start-of-frame markers: JPEG's processes (not DHT C4, JPG C8, DAC CC) and JPEG-LS's SOF55.
_JPEG_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF,
                               0xF7})


def _check_jpeg_frame_headers(pixel_data: bytes, rows: int, columns: int, name: str) -> None:
    """Rejects JPEG and JPEG-LS frames whose frame header (SOF) no decoder should be given.

    A frame header of 0 lines leaves the height to a DNL marker after the
    scan, and pylibjpeg's libjpeg then reads without end, growing by ~50 MB/s
    (baseline, extended, lossless Process 14, JPEG-LS alike; found by
    bench.mutations_convert, issue 39); one of 0 columns, or of more pixels
    than Rows x Columns, has it allocate what the DICOM header never
    claimed. The first frame header of each fragment that starts a
    codestream (SOI) is read, walking the marker segments of encapsulated
    Pixel Data's items, before any decoder is called.
    """
    offset = 0
    while offset + 8 <= len(pixel_data) and pixel_data[offset:offset + 4] == b"\xfe\xff\x00\xe0":
        start = offset + 8
        end = min(start + int.from_bytes(pixel_data[offset + 4:offset + 8], "little"), len(pixel_data))
        offset = end
        if pixel_data[start:start + 2] != b"\xff\xd8":
            continue  # The Basic Offset Table, or a frame's later fragment.
        i = start + 2
        while i + 9 <= end and pixel_data[i] == 0xFF:
            marker = pixel_data[i + 1]
            if marker == 0xFF:  # A fill byte before a marker.
                i += 1
                continue
            if marker in _JPEG_SOF_MARKERS:
                height = int.from_bytes(pixel_data[i + 5:i + 7], "big")
                width = int.from_bytes(pixel_data[i + 7:i + 9], "big")
                if height == 0 or width == 0 or height * width > rows * columns:
                    raise ImageRejected(
                        "corrupt", f"{name}: a JPEG frame header gives {width}x{height} pixels, the DICOM "
                                   f"header {columns}x{rows}" + (" (0 lines: a DNL marker's height, which the "
                                                                 "decoder would read without end)" if height == 0
                                                                 else ""))
                break
            if marker in (0xDA, 0xD9):  # A scan before any frame header: the decoder's to judge.
                break
            i += 2 + int.from_bytes(pixel_data[i + 2:i + 4], "big")


def _install_hint(ts: dicom_uid.UID) -> str:
    packages = _CODEC_PACKAGES.get(ts, "pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg")
    # The packages themselves: shardsmith is installed from a clone, so `shardsmith[dicom]`
    # would not resolve on an index; `pip install '.[dicom]'` in the clone installs them all.
    return f"pip install {packages} (all codecs: pip install '.[dicom]' in shardsmith's folder)"


def _decode_frame(decoder, ds: Dataset, index: int, name: str):
    """Decodes one frame; raw=True leaves colour conversion to `_render`, which records it."""
    try:
        try:
            return decoder.as_array(ds, index=index, raw=True)
        except BaseException as e:
            # Rust decoders (pylibjpeg-rle) panic on some damaged streams;
            # pyo3 raises that as PanicException, a BaseException that pydicom
            # does not catch and that pyo3 does not export to import.
            if type(e).__name__ != "PanicException":
                raise
            raise RuntimeError(f"decoder panic: {e}") from e
    except _DECODER_ERRORS as e:
        ts = decoder.UID
        if ts.is_encapsulated and _PREFERRED_PLUGIN not in decoder.available_plugins:
            # Only a fallback plugin (e.g. Pillow) was tried: it may lack the
            # feature (12-bit JPEG, ...) rather than the file being damaged.
            raise ImageRejected(
                "unsupported_codec",
                f"{name}: the installed decoders ({', '.join(decoder.available_plugins)}) "
                f"failed on {ts.name} ({_short(e)}); for the full decoder, {_install_hint(ts)}",
            ) from e
        raise ImageRejected("corrupt", f"{name}: cannot decode {ts.name} pixel data ({_short(e)})") from e


def _render(arr, meta, ds, index, options, photometric, provenance, name):
    """Maps decoded values to PNG samples; fills `provenance`. Returns (array, channels)."""
    samples = int(meta.get("samples_per_pixel", 1))
    decoded_pi = str(meta.get("photometric_interpretation", photometric)).upper()
    if photometric in _MONOCHROME and samples == 1:
        return _render_grey(arr, ds, index, options, photometric, provenance), 1
    if photometric == _PALETTE and samples == 1:
        _check_palette(ds, name)
        rgb = apply_color_lut(arr, ds)[..., :3]
        bits = 16 if rgb.dtype.itemsize > 1 else 8
        provenance["color_conversion"] = "PALETTE COLOR->RGB"
    elif samples == 3:
        if decoded_pi in _YBR_TO_CONVERT:
            arr = convert_color_space(arr, "YBR_FULL", "RGB")
            provenance["color_conversion"] = f"{decoded_pi}->RGB"
        elif decoded_pi == "RGB":
            # J2K decoders undo YBR_RCT/YBR_ICT themselves.
            provenance["color_conversion"] = (
                None if photometric == "RGB" else f"{photometric}->RGB (decoder)"
            )
        else:
            raise ImageRejected(
                "unsupported_codec",
                f"{name} has photometric interpretation {photometric}, which shardsmith does not convert",
            )
        rgb = arr
        bits = int(meta.get("bits_stored", 8))
    else:
        # A known interpretation with the wrong number of samples is
        # inconsistent; an unknown one (retired ARGB, CMYK, ...) unsupported.
        known = photometric in _MONOCHROME + _YBR_TO_CONVERT + ("RGB", _PALETTE)
        raise ImageRejected(
            "corrupt" if known else "unsupported_codec",
            f"{name} has photometric interpretation {photometric} with {samples} sample(s) per pixel",
        )
    if bits > 8:
        # Full scale of the stored bits maps to 255, e.g. 16-bit 65535 -> 255.
        rgb = np.floor(rgb.astype(np.float64) * (255.0 / (2**bits - 1)) + 0.5)
    provenance.update(rescale=None, modality_lut=False, window=None, inverted=False, bit_depth=8)
    if options.bit_depth != 8:
        provenance["bit_depth_requested"] = options.bit_depth
    return np.clip(rgb, 0, 255).astype(np.uint8), 3


def _check_palette(ds: Dataset, name: str) -> None:
    """Rejects palette LUT descriptors whose entry size is not 8 or 16 bits (PS3.3 C.7.6.3.1.5).

    pydicom builds a NumPy type from the size ("uint0" for 0 bits, a TypeError).
    """
    for colour in ("Red", "Green", "Blue"):
        values = _as_list(ds.get(f"{colour}PaletteColorLookupTableDescriptor"))
        if len(values) != 3 or not all(isinstance(v, int) for v in values):
            raise ImageRejected("corrupt", f"{name}: its {colour} palette LUT descriptor is {values!r}, not 3 numbers")
        if values[2] not in (8, 16):
            raise ImageRejected(
                "corrupt", f"{name}: its {colour} palette LUT descriptor gives {values[2]} bits per entry, not 8 or 16"
            )


def _render_grey(arr, ds, index, options, photometric, provenance):
    """Modality LUT, VOI, MONOCHROME1 inversion, then scaling to the output depth."""
    provenance.update(color_conversion=None, rescale=None, modality_lut=False)
    if "PixelData" not in ds:
        # Float pixel data holds real values already; no Modality LUT applies.
        values = np.nan_to_num(arr.astype(np.float64))
    elif ds.get("ModalityLUTSequence"):
        values = apply_modality_lut(arr, ds).astype(np.float64)
        provenance["modality_lut"] = True
    else:
        slope = _frame_value(ds, index, "PixelValueTransformationSequence", "RescaleSlope")
        intercept = _frame_value(ds, index, "PixelValueTransformationSequence", "RescaleIntercept")
        values = arr.astype(np.float64)
        if slope not in (None, "") or intercept not in (None, ""):
            # A value that is present but not a number leaves the pixels'
            # meaning unknown: float() raises ValueError and the file is corrupt.
            slope = 1.0 if slope in (None, "") else float(slope)
            intercept = 0.0 if intercept in (None, "") else float(intercept)
            values = values * slope + intercept
            provenance["rescale"] = {"slope": slope, "intercept": intercept}

    unit, window = _voi(values, ds, index, options)
    provenance["window"] = window
    inverted = photometric == "MONOCHROME1"
    if inverted:
        # Display white where the values are low, as PS3.3 C.7.6.3.1.2 says.
        unit = 1.0 - unit
    provenance["inverted"] = inverted
    provenance["bit_depth"] = options.bit_depth
    top = 2**options.bit_depth - 1
    out = np.floor(unit * top + 0.5)
    return out.astype(np.uint8 if options.bit_depth == 8 else np.uint16)


def _voi(values, ds, index, options):
    """Applies the VOI transform. Returns (values in [0, 1], window provenance)."""
    if options.window is not None:
        center, width = options.window
        return _window(values, center, width, "LINEAR"), _window_info(center, width, "LINEAR", "cli")

    centers = _frame_value(ds, index, "FrameVOILUTSequence", "WindowCenter", multi=True)
    widths = _frame_value(ds, index, "FrameVOILUTSequence", "WindowWidth", multi=True)
    function = _frame_value(ds, index, "FrameVOILUTSequence", "VOILUTFunction")
    function = str(function or "LINEAR").strip().upper()
    if function not in ("LINEAR", "LINEAR_EXACT", "SIGMOID"):
        function = "LINEAR"
    if centers and widths:
        center, width = _to_float(centers[0]), _to_float(widths[0])
        # PS3.3 C.11.2.1.2: width >= 1 for LINEAR, > 0 otherwise; a file
        # breaking that (or with a non-numeric value) gets the next VOI
        # source rather than a blank image or a reject.
        if (
            center is not None and width is not None
            and math.isfinite(center) and math.isfinite(width)
            and width >= (1 if function == "LINEAR" else 1e-9)
        ):
            source = "file" if len(centers) == 1 and len(widths) == 1 else "file_first_of_n"
            return _window(values, center, width, function), _window_info(center, width, function, source)

    lut = ds.get("VOILUTSequence")
    if lut:
        return _apply_voi_lut(values, lut[0], ds), {
            "center": None, "width": None, "function": "LUT", "source": "voi_lut",
        }

    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    if high <= low:
        # A constant image has no contrast to stretch: it renders black.
        return np.zeros(values.shape), _window_info((low + high) / 2, 0.0, "LINEAR_EXACT", "min_max")
    center, width = (low + high) / 2, high - low
    return (
        _window(values, center, width, "LINEAR_EXACT"),
        _window_info(center, width, "LINEAR_EXACT", "min_max"),
    )


def _window(values, center: float, width: float, function: str):
    """The VOI LUT functions of PS3.3 C.11.2.1.2-3, as values in [0, 1].

    LINEAR:       y = clip((x - (c - 0.5)) / (w - 1) + 0.5, 0, 1)
                  (C.11.2.1.2.1; a width of 1 is a threshold at c - 0.5)
    LINEAR_EXACT: y = clip((x - c) / w + 0.5, 0, 1)
    SIGMOID:      y = 1 / (1 + exp(-4 (x - c) / w))
    The caller scales y to 0..255 or 0..65535.
    """
    if function == "SIGMOID":
        return 1.0 / (1.0 + np.exp(np.clip(-4.0 * (values - center) / width, -700, 700)))
    if function == "LINEAR_EXACT":
        return np.clip((values - center) / width + 0.5, 0.0, 1.0)
    if width == 1:
        return (values > center - 0.5).astype(np.float64)
    return np.clip((values - (center - 0.5)) / (width - 1) + 0.5, 0.0, 1.0)


def _window_info(center, width, function, source) -> dict:
    return {"center": float(center), "width": float(width), "function": function, "source": source}


def _apply_voi_lut(values, item: Dataset, ds: Dataset):
    """Maps values through a VOI LUT; its output range 0..2**bits-1 (LUT Descriptor) becomes [0, 1].

    pydicom's `apply_voi` indexes through an array of the LUT's own dtype, so
    an 8-bit LUT with more than 256 entries would wrap; the lookup is done
    here with wide integers instead.
    """
    entries, first, bits = (int(v) for v in item.LUTDescriptor)
    entries = entries or 65536  # PS3.3 C.11.2.1.1: 0 means 2**16 entries.
    raw = item.LUTData
    if isinstance(raw, (bytes, bytearray)):
        little = ds.file_meta.TransferSyntaxUID != dicom_uid.ExplicitVRBigEndian
        lut = np.frombuffer(raw, dtype="<u2" if little else ">u2")[:entries].astype(np.int64)
    else:
        lut = np.asarray(raw if isinstance(raw, (list, MultiValue)) else [raw], dtype=np.int64)
    if lut.size == 0:
        raise ValueError("empty VOI LUT Data")
    index = np.clip(np.floor(values + 0.5) - first, 0, lut.size - 1).astype(np.int64)
    top = 2**bits - 1 if 8 <= bits <= 16 else int(lut.max()) or 1
    return np.clip(lut[index] / top, 0.0, 1.0)


def _frame_value(ds: Dataset, index: int, sequence: str, keyword: str, multi: bool = False):
    """A value from the frame's functional groups (enhanced multi-frame files) or the top level.

    Per-frame groups win over shared ones, which win over the top-level
    element (PS3.3 C.7.6.16). Returns None when absent; with `multi`, a list.
    """
    sources = []
    per_frame = ds.get("PerFrameFunctionalGroupsSequence")
    if per_frame and index < len(per_frame):
        sources.append(per_frame[index])
    shared = ds.get("SharedFunctionalGroupsSequence")
    if shared:
        sources.append(shared[0])
    for group in sources:
        items = group.get(sequence)
        if items and keyword in items[0]:
            return _as_list(items[0].get(keyword)) if multi else items[0].get(keyword)
    value = ds.get(keyword)
    if multi:
        return _as_list(value)
    return value


def _to_float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _as_list(value) -> list:
    if value is None or value == "":
        return []
    if isinstance(value, (list, MultiValue, tuple)):
        return [v for v in value if v is not None and v != ""]
    return [value]


def _num_frames(ds: Dataset, name: str) -> int:
    value = ds.get("NumberOfFrames")
    if value is None or value == "":
        return 1
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise ImageRejected("corrupt", f"{name}: NumberOfFrames {value!r} is not a whole number") from None
    # pydicom reads 0 (or less) as 1 too.
    return max(count, 1)


def _frame_indices(num_frames: int, frames: str) -> list[int]:
    if frames == "all":
        return list(range(num_frames))
    if frames == "middle":
        return [num_frames // 2]
    return [0]


def _encode_png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    # uint16 becomes mode I;16, which Pillow writes as a 16-bit grey PNG.
    # Level 6 gives most of the size win at a fraction of level 9's time.
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, "PNG", compress_level=6)
    return buf.getvalue()


def _tag_string(ds: Dataset, keyword: str) -> str:
    """An element's value as a string; '' when absent or empty."""
    _load_pydicom()
    value = ds.get(keyword)
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return value.decode("latin-1").strip("\x00 ")
    if isinstance(value, (list, MultiValue, tuple)):
        return "\\".join(str(v) for v in value)
    return str(value).strip()


def _check_keyword(keyword, flag: str) -> None:
    _load_pydicom()
    if not isinstance(keyword, str) or tag_for_keyword(keyword) is None:
        raise ValueError(
            f"{flag} must name DICOM keywords such as Modality or BodyPartExamined. "
            f"Received: {keyword!r}"
        )
    vr = dictionary_VR(tag_for_keyword(keyword))
    if vr in _NON_STRING_VRS:
        raise ValueError(
            f"{flag} can only store elements with text or number values; {keyword} has VR {vr}"
        )


# The SOP classes of segmentations, to their kind: a DICOM SEG (Segmentation Storage; Label Map
# Segmentation Storage, PS3.4 2024, which pydicom 3.0's UID dictionary does not know yet) and an RT
# Structure Set. Under --volumes they are the masks of the series they reference
# (`imaging.dicom_masks`), never volumes of their own.
SEGMENTATION_SOP_CLASSES = {
    "1.2.840.10008.5.1.4.1.1.66.4": "seg",
    "1.2.840.10008.5.1.4.1.1.66.7": "seg",
    "1.2.840.10008.5.1.4.1.1.481.3": "rtstruct",
}


def check_not_segmentation(ds: Dataset, name: str) -> None:
    """Raises ImageRejected('segmentation_object') for a SEG or RTSTRUCT met as a --volumes input.

    A SEG's frames are no image of the patient, and an RTSTRUCT has none: both annotate
    another series, and are read as its mask (--masks_dir), not planned as volumes.
    """
    sop = str(ds.get("SOPClassUID", "") or "")
    kind = SEGMENTATION_SOP_CLASSES.get(sop)
    if kind is not None:
        what = "a DICOM Segmentation (SEG)" if kind == "seg" else "a DICOM RT Structure Set (RTSTRUCT)"
        raise ImageRejected(
            "segmentation_object",
            f"{name} is {what}: the mask of the series it references, not a volume; give --masks_dir "
            "(the folder it is in, which may be --input_dir itself) to store it as that series' mask")


def _sop_class_name(ds: Dataset) -> str:
    _load_pydicom()
    sop = ds.get("SOPClassUID") or getattr(getattr(ds, "file_meta", None), "MediaStorageSOPClassUID", None)
    if not sop:
        return ""
    try:
        return dicom_uid.UID(str(sop)).name
    except _PYDICOM_ERRORS:
        return str(sop)


def _is_real(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _short(e: BaseException) -> str:
    """An exception as one line, for reject messages."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return (text or type(e).__name__)[:300]


def is_keyword(keyword: str) -> bool:
    """Whether `keyword` names a DICOM data element (e.g. 'PatientID')."""
    _load_pydicom()
    return isinstance(keyword, str) and tag_for_keyword(keyword) is not None


def read_dataset(data: bytes, name: str, require_pixels: bool = True) -> Dataset:
    """Parses a DICOM file for the volume path (`imaging/volumes.py`), pixels undecoded.

    Args:
      data: The file's bytes.
      name: The file's name, for messages.
      require_pixels: Whether a file without pixel data is rejected; False for
        objects that hold none by design (an RT Structure Set's contours,
        `imaging/dicom_masks.py`).

    Raises:
      ImageRejected: 'not_an_image' (not DICOM), 'corrupt' (unreadable
        header), 'no_pixel_data' (reports, plans, structure sets).
    """
    _load_pydicom()
    if not is_dicom(data[:1024]):
        raise ImageRejected("not_an_image", f"{name} is not a DICOM file")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ds = pydicom.dcmread(io.BytesIO(data), force=True)
            keyword = next((k for k in _PIXEL_KEYWORDS if k in ds), None)
        except _PYDICOM_ERRORS as e:
            raise ImageRejected("corrupt", f"{name}: unreadable DICOM header ({_short(e)})") from e
    if keyword is None and require_pixels:
        check_not_segmentation(ds, name)
        sop = _sop_class_name(ds)
        raise ImageRejected("no_pixel_data", f"{name} is a DICOM {sop} without pixel data" if sop
                            else f"{name} is a DICOM file without pixel data")
    return ds


def read_header(f, name: str) -> tuple[Dataset, str, int]:
    """Parses a DICOM file's header for the volume path's planning, its pixels not read.

    Args:
      f: A binary file object at the file's start (only the header is read from it).
      name: The file's name in errors.

    Returns:
      (dataset without its pixel element, that element's keyword: 'PixelData',
      'FloatPixelData' or 'DoubleFloatPixelData', the offset in the file of
      its native pixel values or -1: see `native_pixel_offset`).

    Raises:
      ImageRejected: As `read_dataset`: 'not_an_image', 'corrupt', 'no_pixel_data'.
    """
    _load_pydicom()
    head = f.read(1024)
    if not is_dicom(head):
        raise ImageRejected("not_an_image", f"{name} is not a DICOM file")
    f.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ds = pydicom.dcmread(f, force=True, stop_before_pixels=True)
        except _PYDICOM_ERRORS as e:
            raise ImageRejected("corrupt", f"{name}: unreadable DICOM header ({_short(e)})") from e
    # pydicom stops at the first pixel element (7FE0,0008/0009/0010), its tag next in the file.
    tag_offset = f.tell()
    tag = f.read(4)
    keyword = None
    if len(tag) == 4:
        for order in "<>":
            group, element = struct.unpack(order + "HH", tag)
            if group == 0x7FE0 and element in _PIXEL_ELEMENTS:
                keyword = _PIXEL_ELEMENTS[element]
                break
    if keyword is None:
        check_not_segmentation(ds, name)
        sop = _sop_class_name(ds)
        raise ImageRejected("no_pixel_data", f"{name} is a DICOM {sop} without pixel data" if sop
                            else f"{name} is a DICOM file without pixel data")
    rest = f.read(8)
    _check_pixel_element(rest, order, ds, keyword, name)
    return ds, keyword, native_pixel_offset(ds, keyword, order, tag_offset, rest)


# Uncompressed little-endian transfer syntaxes: the pixel values are the element's bytes as they
# lie in the file (deflated explicit VR is not: its body is compressed).
_NATIVE_SYNTAXES = ("1.2.840.10008.1.2", "1.2.840.10008.1.2.1")
_NATIVE_PHOTOMETRIC = ("MONOCHROME1", "MONOCHROME2")


def native_pixel_offset(ds: Dataset, keyword: str, order: str, tag_offset: int, rest: bytes) -> int:
    """Where a single-frame grey file's pixel values start in the file, when they can be read as they lie.

    So the volume path reads them with `decode_native_frame` instead of parsing
    the whole file again and decoding through pydicom (2-3 ms of a 512x512
    slice's ~3.5 ms). Only a file whose values pydicom would give unchanged
    but for the unused high bits qualifies: an uncompressed little-endian
    transfer syntax named in its File Meta, one frame, one sample,
    MONOCHROME1/2, BitsAllocated 8, 16 or 32, 1 <= BitsStored <= BitsAllocated,
    PixelRepresentation 0 or 1, and a defined length of the frame's size (+1
    pad byte); every other file returns -1 and is decoded by pydicom
    (`decode_stored_frame`), with its checks.

    Args:
      ds: The header (`read_header`).
      keyword: Its pixel element's keyword.
      order: The byte order its tag was read in ('<' or '>').
      tag_offset: The offset of the pixel element's tag in the file.
      rest: The 8 bytes after that tag.
    """
    syntax = str(getattr(ds, "file_meta", {}).get("TransferSyntaxUID", "") or "")
    if keyword != "PixelData" or order != "<" or syntax not in _NATIVE_SYNTAXES or len(rest) < 8:
        return -1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows, columns = int(ds.Rows), int(ds.Columns)
            allocated, stored = int(ds.BitsAllocated), int(ds.BitsStored)
            representation = int(ds.PixelRepresentation)
            samples = int(ds.get("SamplesPerPixel", 1) or 1)
            frames = ds.get("NumberOfFrames")
            photometric = str(ds.PhotometricInterpretation).strip().upper()
    except (AttributeError, TypeError, ValueError, KeyError):
        return -1  # Missing or damaged: pydicom's decoding says what is wrong.
    if frames not in (None, "") and str(frames).strip() != "1":
        return -1
    if not (rows > 0 and columns > 0 and samples == 1 and photometric in _NATIVE_PHOTOMETRIC
            and allocated in (8, 16, 32) and 1 <= stored <= allocated and representation in (0, 1)):
        return -1
    explicit = syntax != _IMPLICIT_VR_LITTLE_ENDIAN
    _, length = _element_header(rest, "<", explicit)
    expected = rows * columns * allocated // 8
    if length not in (expected, expected + 1):
        return -1
    # Explicit VR: tag, VR, 2 reserved bytes, 4-byte length; implicit: tag, 4-byte length.
    return tag_offset + (12 if explicit else 8)


def dataset_pixel_offset(ds: Dataset, data: bytes) -> int:
    """`native_pixel_offset` of a dataset `read_dataset` parsed from `data` (its pixels read too)."""
    element = ds.get_item("PixelData") if "PixelData" in ds else None
    value_at = getattr(element, "value_tell", None)
    if value_at is None:
        value_at = getattr(element, "file_tell", None)
    syntax = str(getattr(ds, "file_meta", {}).get("TransferSyntaxUID", "") or "")
    if value_at is None or syntax not in _NATIVE_SYNTAXES:
        return -1
    tag_offset = value_at - (8 if syntax == _IMPLICIT_VR_LITTLE_ENDIAN else 12)
    if tag_offset < 0 or data[tag_offset:tag_offset + 4] != _PIXEL_DATA_TAG:
        return -1
    return native_pixel_offset(ds, "PixelData", "<", tag_offset, data[tag_offset + 4:tag_offset + 12])


def decode_native_frame(data, offset: int, rows: int, columns: int, dtype: str, bits_stored: int):
    """A frame's stored values read where `native_pixel_offset` found them, as pydicom decodes them.

    pydicom's native decoding: the values little-endian in the dtype of
    BitsAllocated and PixelRepresentation, the bits above BitsStored dropped
    (shifted out and back: sign-extended when signed).

    Returns:
      The (rows, columns) array (a read-only view of `data` when every bit is
      stored, else a corrected copy), or None when the bytes at `offset` are
      not that pixel element (the file changed since its header was read):
      the caller decodes the file with pydicom.
    """
    dtype = np.dtype(dtype).newbyteorder("<")
    expected = rows * columns * dtype.itemsize
    if offset < 12 or offset + expected > len(data):
        return None
    # The element's tag 12 bytes before its value (explicit VR) or 8 (implicit VR).
    for explicit, header in ((True, 12), (False, 8)):
        if data[offset - header:offset - header + 4] == _PIXEL_DATA_TAG:
            _, length = _element_header(data[offset - header + 4:offset - header + 12], "<", explicit)
            break
    else:
        return None
    if length not in (expected, expected + 1):
        return None
    values = np.frombuffer(data, dtype, rows * columns, offset).reshape(rows, columns)
    shift = dtype.itemsize * 8 - bits_stored
    if shift:
        values = values.copy()
        np.left_shift(values, shift, out=values)
        np.right_shift(values, shift, out=values)
    return values


# (7FE0,0010) as little-endian bytes.
_PIXEL_DATA_TAG = b"\xe0\x7f\x10\x00"


# The VRs a pixel element's bytes may have (explicit VR: 2 reserved bytes, then a 4-byte length).
_PIXEL_VRS = (b"OB", b"OW", b"OF", b"OD", b"OL", b"OV", b"UN")
_IMPLICIT_VR_LITTLE_ENDIAN = "1.2.840.10008.1.2"


def _element_header(rest, order: str, explicit: bool) -> tuple[bytes, int]:
    """(VR, value length) of a pixel element, from the 8 bytes after its tag.

    Explicit VR: the 2-byte VR, 2 reserved bytes, then a 4-byte length (the
    form of every VR a pixel element may have, `_PIXEL_VRS`); implicit VR: a
    4-byte length (the VR returned is b""). `order`: '<' or '>'.
    """
    if explicit:
        return bytes(rest[:2]), struct.unpack(order + "I", rest[4:8])[0]
    return b"", struct.unpack(order + "I", rest[:4])[0]


def _check_pixel_element(rest: bytes, order: str, ds: Dataset, keyword: str, name: str) -> None:
    """Rejects a pixel element that holds no pixel bytes: its length 0, or its VR changed to a number's.

    As `read_dataset` does for the 2-D path (issue 39: pydicom's decoders fail on them with a
    TypeError, and a whole series with them). `rest`: the 8 bytes after the element's tag.
    """
    if len(rest) < 8:
        return  # Cut short: the writer reads the file and says so.
    syntax = str(getattr(ds, "file_meta", {}).get("TransferSyntaxUID", "") or "")
    explicit = syntax != _IMPLICIT_VR_LITTLE_ENDIAN if syntax else rest[:2] in _PIXEL_VRS
    if explicit and not _is_vr(rest[:2]):
        # Some writers encode the pixel element with an implicit VR header in an explicit VR
        # file (pydicom's SC_rgb_jpeg.dcm: tag, then FFFFFFFF). pydicom reads an element whose
        # VR bytes are no VR (outside AA..ZZ) as implicit VR, and decodes its pixels.
        explicit = False
    vr, length = _element_header(rest, order, explicit)
    if explicit and vr not in _PIXEL_VRS:
        raise ImageRejected("corrupt", f"{name}: its {keyword} element (VR {vr.decode('latin-1')!r}) "
                                       "holds no pixel bytes")
    if length == 0:
        raise ImageRejected("corrupt", f"{name}: its {keyword} element is empty (length 0): no pixel bytes")


def _is_vr(code: bytes) -> bool:
    """Whether two bytes may be a VR, by pydicom's test (from b"AA" to b"ZZ") for an implicit VR switch."""
    return len(code) == 2 and b"AA" <= bytes(code) <= b"ZZ"


# The pixel elements of group 7FE0, by element number.
_PIXEL_ELEMENTS = {0x0010: "PixelData", 0x0008: "FloatPixelData", 0x0009: "DoubleFloatPixelData"}


def frame_value(ds: Dataset, index: int, sequence: str, keyword: str, multi: bool = False):
    """A frame's value: per-frame functional group, else shared, else top level (PS3.3 C.7.6.16)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _frame_value(ds, index, sequence, keyword, multi)


def num_frames(ds: Dataset, name: str) -> int:
    """The frames of a dataset (1 without NumberOfFrames). Raises ImageRejected('corrupt')."""
    return _num_frames(ds, name)


def decode_stored_frame(ds: Dataset, index: int, name: str) -> np.ndarray:
    """One frame's stored values (before any rescale), single-channel, as the 2-D path decodes them.

    The same transfer-syntax checks and decoders as `decode_dicom` (compressed
    syntaxes, JP2 box walk, decoder panics).

    Raises:
      ImageRejected: 'unsupported_codec', 'unsupported_dtype' (colour), 'corrupt'.
    """
    _load_pydicom()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            missing = [k for k in _IMAGE_PIXEL_ELEMENTS if ds.get(k) in (None, "")]
            if missing:
                raise ImageRejected("corrupt", f"{name} has pixel data but lacks {', '.join(missing)}")
            if int(ds.get("SamplesPerPixel", 1) or 1) != 1:
                raise ImageRejected("unsupported_dtype", f"{name} has colour pixels; a volume is single-channel")
            ts, _ = _transfer_syntax(ds, name)
            decoder = _decoder_for(ts, name)
            if ts in _J2K_SYNTAXES and index == 0:
                _check_jp2_boxes(ds.PixelData, name)
            elif _CODEC_PACKAGES.get(ts) == _LIBJPEG and index == 0:
                _check_jpeg_frame_headers(ds.PixelData, int(ds.Rows), int(ds.Columns), name)
            arr, _meta = _decode_frame(decoder, ds, index, name)
        except _PYDICOM_ERRORS as e:
            raise ImageRejected("corrupt", f"{name}: {_short(e)}") from e
    if arr.ndim != 2:
        raise ImageRejected("unsupported_dtype", f"{name}: frame of shape {arr.shape} is not one grey plane")
    return arr
