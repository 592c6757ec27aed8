"""Static files that never turn a page into a 500.

`collectstatic` copies the files into STATIC_ROOT with a content hash in each name (cacheable for
ever) and gzip and Brotli copies beside them. A server started without it, or with a manifest from an
older release that lacks a newer file, would answer every page with a 500 ("Missing staticfiles
manifest entry"): such a file is linked by its plain name instead, which WhiteNoise serves from the
application's own static folders (WHITENOISE_USE_FINDERS), briefly cacheable. A warning names the
missing step once per file."""

import logging
from functools import cache

from whitenoise.storage import CompressedManifestStaticFilesStorage

logger = logging.getLogger(__name__)


@cache
def warn_not_collected(name: str) -> None:
    logger.warning(
        "The static file %s has not been collected: it is served by its plain name, without a content "
        "hash or compression. Run `python manage.py collectstatic` (make serve does).",
        name,
    )


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    def stored_name(self, name: str) -> str:
        try:
            return super().stored_name(name)
        except ValueError:  # not in the manifest, or no manifest at all
            warn_not_collected(name)
            return name
