from django.apps import AppConfig
from django.core import checks
from django.db.backends.signals import connection_created
from django.db.models.signals import post_delete, post_migrate, post_save, pre_migrate


class LedgerConfig(AppConfig):
    name = "ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: they import the models, which Django loads only once every app is registered.
        from .bootstrap import after_migrate
        from .database import searched_text, tallies
        from .lifecycle.retention import check_retention_setting
        from .models import ExchangeRate
        from .money.currency import check_rate_file, forget_entered_rates
        from .money.labour import check_review_hourly_rate
        from .money.pricing import check_price_file
        from .notices.notifications import check_notify_secret
        from .notices.provider_hooks import check_webhook_secrets
        from .notices.receivers import check_private_receivers

        post_migrate.connect(after_migrate, sender=self, dispatch_uid="ledger.after_migrate")
        # SQLite's `bd_searched`, the catalogue search's text (PostgreSQL's is migration 0056's).
        connection_created.connect(
            searched_text.give_sqlite_the_function, dispatch_uid="ledger.database.searched_text"
        )
        # Item and draft tallies' triggers on SQLite are put back around every migrate (ledger/database/tallies.py).
        pre_migrate.connect(
            tallies.before_migrate, sender=self, dispatch_uid="ledger.database.tallies.before"
        )
        post_migrate.connect(tallies.after_migrate, sender=self, dispatch_uid="ledger.database.tallies.after")
        # Costs are shown everywhere: a price file that cannot be read stops every process at
        # startup (`check`, `runserver`, `migrate`, `qcluster`), never a request.
        checks.register(check_price_file, "batchdesk")
        checks.register(check_rate_file, "batchdesk")
        checks.register(check_notify_secret, "batchdesk")
        # `check --deploy` warns when production lets notices reach inside its network.
        checks.register(check_private_receivers, "batchdesk", deploy=True)
        # A provider's webhook secret that cannot sign would refuse every webhook: refused at startup.
        checks.register(check_webhook_secrets, "batchdesk")
        checks.register(check_retention_setting, "batchdesk")
        checks.register(check_review_hourly_rate, "batchdesk")
        post_save.connect(
            forget_entered_rates, sender=ExchangeRate, dispatch_uid="ledger.money.currency.saved"
        )
        post_delete.connect(
            forget_entered_rates, sender=ExchangeRate, dispatch_uid="ledger.money.currency.deleted"
        )
