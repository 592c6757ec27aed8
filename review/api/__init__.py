"""The JSON API (SPEC §6), `/metrics` and the providers' webhooks: one wing with one door.

`errors` (the one error shape), `doors` (who calls and what role each method needs), `inputs`
(bodies read through forms), `shapes` (the JSON of each resource), then one module per resource and
`urls`. Every view passes `doors.door`; tests/api/test_one_door.py walks every route to prove it.
"""
