from django.apps import AppConfig
from django.core import checks


class ReviewConfig(AppConfig):
    name = "review"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Here, not at the top: it imports the models, which Django loads only once every app is registered.
        from .company_sign_in import check_company_sign_in, check_issuer_over_tls

        # Company sign-in settings that would fail every sign-in stop every process at startup.
        checks.register(check_company_sign_in, "batchdesk")
        # `check --deploy` warns when the issuer is reached over plain http.
        checks.register(check_issuer_over_tls, "batchdesk", deploy=True)
