from django.apps import AppConfig
from django.core import checks


class ReviewConfig(AppConfig):
    name = "review"

    def ready(self) -> None:
        # The screens and the API show prices: a price file that cannot be read stops every
        # process at startup (`check`, `runserver`, `migrate`, `qcluster`), never a request.
        from ledger.pricing import check_price_file

        checks.register(check_price_file, "batchdesk")
