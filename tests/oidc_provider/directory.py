"""What the provider says about a person: who they are and their groups, in the claim a company
configured (settings.GROUPS_CLAIM), in the ID token and at the user info endpoint alike."""

from django.conf import settings
from oauth2_provider.oauth2_validators import OAuth2Validator


class DirectoryValidator(OAuth2Validator):
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, settings.GROUPS_CLAIM: "profile"}

    def get_additional_claims(self, request):
        person = request.user
        return {
            "preferred_username": person.username,
            "email": person.email,
            "given_name": person.first_name,
            "family_name": person.last_name,
            settings.GROUPS_CLAIM: sorted(person.groups.values_list("name", flat=True)),
        }
