from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from review import accounts, company_sign_in, preferences
from review.api import errors, metrics, provider_hooks

urlpatterns = [
    path("admin/", admin.site.urls),
    # Sign-in, sign-out and changing one's own password. No password reset by e-mail: BatchDesk
    # sends no mail, and admins reset passwords in /admin/.
    path("accounts/login/", accounts.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path(
        "accounts/password_change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("accounts/preferences/", preferences.preferences, name="preferences"),
    # The company's OpenID Connect sign-in (404 while BATCHDESK_OIDC_ISSUER is unset). The provider is
    # told https://HOST/oidc/callback/ as the redirect URI.
    path("oidc/authenticate/", company_sign_in.StartSignIn.as_view(), name="company_sign_in"),
    path("oidc/callback/", company_sign_in.FinishSignIn.as_view(), name="company_sign_in_callback"),
    path("api/", include("review.api.urls")),
    path("metrics", metrics.metrics, name="metrics"),
    # The providers' batch webhooks: signed by the provider, not under /api/ (no token, no session).
    path("hooks/openai", provider_hooks.openai_hook, name="openai_hook"),
    path("hooks/gemini", provider_hooks.gemini_hook, name="gemini_hook"),
    path("", include("review.urls")),
]

handler400 = errors.bad_request
handler500 = errors.server_error
