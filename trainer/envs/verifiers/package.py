"""The verifiers package as `env.name=verifiers` loads it: imported with a hint naming the extra when it is
missing (`INSTALL_HINT`), its version checked against the tested range, and nltk's downloads made a local check
(rwcore downloads nothing at run time).
"""

from __future__ import annotations

INSTALL_HINT = (
    "env.name=verifiers needs the verifiers package (tested with 0.4.0): "
    "RWCORE_EXTRAS=test,bench,vllm,verifiers bash scripts/setup.sh (installs scripts/verifiers-requirements.txt "
    "with --no-deps), or pip install 'verifiers==0.4.0' in an environment that can take its openai<3 pin"
)
TESTED_VERSION = "0.4.0"  # rwcore.integrations.versions.TESTED["verifiers"] holds the range


def _import_verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} ({error})") from None
    return vf


def _offline_nltk() -> None:
    """rwcore downloads nothing at run time; TextArena's games and verifiers' TextArena taskset call
    nltk.download when they load. Make that a local check: a resource that is there is used (True); a missing
    one is not fetched: False, as nltk.download answers when it cannot download, with a warning naming
    NLTK_DATA (the code that really needs it then raises nltk's LookupError naming the resource)."""
    try:
        import nltk
    except ImportError:
        return
    if getattr(nltk.download, "_rwcore_offline", False):
        return
    import logging

    warned: set[str] = set()

    def download(info_or_id=None, *args, **kwargs) -> bool:
        name = str(info_or_id or "")
        for kind in ("corpora", "taggers", "tokenizers", "models", "misc", "chunkers", "stemmers", "grammars"):
            try:
                nltk.data.find(f"{kind}/{name}")
                return True
            except LookupError:
                continue
        if name not in warned:
            warned.add(name)
            logging.getLogger("rwcore.trainer.envs.verifiers").warning(
                "nltk.download(%r) skipped: rw train downloads nothing at run time. If the environment needs it, "
                "put it under a folder on NLTK_DATA (searched: %s)",
                name,
                list(nltk.data.path),
            )
        return False

    download._rwcore_offline = True
    nltk.download = download
    if hasattr(nltk, "downloader"):
        nltk.downloader.download = download


def _warn_version() -> None:
    """One warning outside the tested release (the range rwcore.integrations.versions declares for verifiers)."""
    from importlib.metadata import PackageNotFoundError, version

    from rwcore.integrations.versions import check_version

    try:
        check_version("verifiers", version("verifiers"))
    except PackageNotFoundError:
        pass
