"""The roles of SPEC §8 and who holds one. Roles are Django groups that every migrate puts in place
(`ledger.bootstrap`); what each role may do on a screen or through the API is `review.permissions`."""

CATALOGUE_OWNER, OPERATOR, ADMIN = ROLES = ("catalogue_owner", "operator", "admin")


def roles_of(user) -> frozenset[str]:
    """The user's group names, read once per request."""
    if not user.is_authenticated:
        return frozenset()
    cached = getattr(user, "_batchdesk_roles", None)
    if cached is None:
        cached = frozenset(user.groups.values_list("name", flat=True))
        user._batchdesk_roles = cached
    return cached


def has_role(user, *groups: str) -> bool:
    """Superusers and the `admin` group pass everything."""
    if not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    roles = roles_of(user)
    return ADMIN in roles or not roles.isdisjoint(groups)
