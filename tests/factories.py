"""Factories for the ledger, one trait per item state."""

import factory
from django.contrib.auth.models import Group, User

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
    """An item put straight into a state, for screens and rules that start there."""

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


def add_version(item: Item, content: str = "", *, valid: bool = True, reasons=None) -> GeneratedVersion:
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
        input_tokens=120,
        output_tokens=60,
        valid=valid,
        validation_reasons=reasons or [],
    )
