"""One product's content changed by a person (the API today), checked by the importer's rules
(`check_product_record`) before it is recorded: what a person sends is judged like a file's line."""

from ..actions.products import ProductChange, record_product
from .checks import CheckedProduct, check_product_record


class ProductRefused(ValueError):
    """The content breaks SPEC §7's rules; `problems` says where, as `CheckedProduct.problems`."""

    def __init__(self, checked: CheckedProduct):
        super().__init__(checked.words())
        self.problems = checked.problems


def revise_product(*, sku: str, title: str, fields: dict, actor=None) -> ProductChange:
    """New content for a product (a new revision only if the content changed). Status is not content:
    a product is withdrawn by `withdraw_product`."""
    checked = check_product_record({**fields, "sku": sku, "title": title})
    if checked.problems:
        raise ProductRefused(checked)
    return record_product(sku=checked.sku, title=checked.title, fields=checked.fields, actor=actor)
