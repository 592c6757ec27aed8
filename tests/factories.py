"""Factories for the ledger, one trait per item state. An item reaches its state as the ledger
brings it there: made `prepared`, then moved step by step along the usual path by the transition
verb (`ledger.actions.change_state`), which checks each step against the transition table and
writes its event; the job's tallies follow from the items' rows. No provider is asked."""

import factory
from django.contrib.auth.models import Group, User

from ledger.actions.core import change_state
from ledger.models import (
    GeneratedVersion,
    Item,
    Job,
    Product,
    PromptVersion,
    SourceRevision,
    content_hash,
)
from ledger.states import ItemState

S = ItemState
_REVIEWED = [S.SUBMITTED, S.RETURNED, S.AWAITING_REVIEW]
_APPLYING = [*_REVIEWED, S.APPROVED, S.APPLYING]
# The usual way from `prepared` to each state: sent, answered, judged, reviewed, applied. A dead
# letter is an item whose inference kept failing; an obsolete, withdrawn or cancelled one was
# stopped before it was sent.
USUAL_PATH: dict[str, list[str]] = {
    S.PREPARED: [],
    S.SUBMITTED: [S.SUBMITTED],
    S.SUBMISSION_UNCERTAIN: [S.SUBMISSION_UNCERTAIN],
    S.RETURNED: [S.SUBMITTED, S.RETURNED],
    S.INFERENCE_FAILED: [S.SUBMITTED, S.INFERENCE_FAILED],
    S.VALIDATION_FAILED: [S.SUBMITTED, S.RETURNED, S.VALIDATION_FAILED],
    S.AWAITING_REVIEW: _REVIEWED,
    S.REJECTED: [*_REVIEWED, S.REJECTED],
    S.APPROVED: [*_REVIEWED, S.APPROVED],
    S.APPLYING: _APPLYING,
    S.APPLIED: [*_APPLYING, S.APPLIED],
    S.DESTINATION_REJECTED: [*_APPLYING, S.DESTINATION_REJECTED],
    S.DEAD_LETTER: [S.SUBMITTED, S.INFERENCE_FAILED, S.DEAD_LETTER],
    S.OBSOLETE: [S.OBSOLETE],
    S.WITHDRAWN: [S.WITHDRAWN],
    S.CANCELLED: [S.CANCELLED],
}


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"person{n}")
    password = factory.django.Password("pw")

    @factory.post_generation
    def roles(self, create, extracted, **kwargs):
        for name in extracted or []:
            self.groups.add(Group.objects.get(name=name))


class ProductFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Product
        skip_postgeneration_save = True

    sku = factory.Sequence(lambda n: f"SKU-{n:05d}")

    @factory.post_generation
    def revision(self, create, extracted, **kwargs):
        title = kwargs.get("title", f"Oak chopping board {self.sku}")
        fields = kwargs.get("fields", {"material": "oak", "dimensions": "40 x 25 cm"})
        self.current_revision = SourceRevision.objects.create(
            product=self,
            number=1,
            title=title,
            fields=fields,
            content_hash=SourceRevision.hash_content(title, fields),
        )
        self.save()


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    reference = factory.Sequence(lambda n: f"job-{n}")
    owner = factory.SubFactory(UserFactory)
    task = "product_description"
    prompt_version = factory.LazyFunction(
        lambda: PromptVersion.objects.get(task="product_description", version=1)
    )
    provider = "emulator"
    model = "gpt-4o-mini"


class ItemFactory(factory.django.DjangoModelFactory):
    """An item brought to a state along its usual path (`USUAL_PATH`), for screens and rules that
    start there. `reason` and `reason_code` are the last step's."""

    class Meta:
        model = Item

    job = factory.SubFactory(JobFactory)
    product = factory.SubFactory(ProductFactory)
    source_revision = factory.LazyAttribute(lambda o: o.product.current_revision)
    state = ItemState.PREPARED

    class Params:
        awaiting_review = factory.Trait(state=ItemState.AWAITING_REVIEW)
        submitted = factory.Trait(state=ItemState.SUBMITTED)
        approved = factory.Trait(state=ItemState.APPROVED)

    @classmethod
    def _create(cls, model_class, *args, state=ItemState.PREPARED, reason="", reason_code="", **kwargs):
        path = USUAL_PATH[state]
        if not path:  # made prepared: the reason is its own
            return super()._create(model_class, *args, reason=reason, reason_code=reason_code, **kwargs)
        item = super()._create(model_class, *args, state=ItemState.PREPARED, **kwargs)
        for step in path:
            last = step == path[-1]
            item = change_state(
                item.pk, to=step, reason=reason if last else "", code=reason_code if last else ""
            )
        return item


def add_version(
    item: Item,
    content: str = "",
    *,
    valid: bool = True,
    reasons=None,
    input_tokens: int = 120,
    output_tokens: int = 60,
) -> GeneratedVersion:
    content = content or (
        f"A sturdy board made from oak for {item.product.sku}. It measures 40 x 25 cm and suits daily use."
    )
    number = item.versions.count() + 1
    return GeneratedVersion.objects.create(
        item=item,
        number=number,
        custom_id=f"bd-{item.pk}-{number}",
        content=content,
        raw_output=content,
        content_hash=content_hash(content),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        valid=valid,
        validation_reasons=reasons or [],
    )
