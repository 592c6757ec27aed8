"""A real OpenID provider for the company sign-in tests: a small Django project of its own on
django-oauth-toolkit (OIDC, RS256 with a key made by the test, PKCE required), its own SQLite
database, people in groups exposed in a claim of the test's choosing. Started in a process of its
own by `running.py`; never imported by BatchDesk."""
