"""The inventory functions other parts call (docs/contracts.md) keep their signatures."""

from __future__ import annotations

import inspect

from clusterctl.inventory import ansible, loader, nodeset, select

API = {
    loader.load_inventory: "(path: 'str | os.PathLike[str]', force: 'bool' = False) -> 'Inventory'",
    loader.load_inventory_text: "(text: 'str', filename: 'str' = '<string>', force: 'bool' = False) -> 'Inventory'",
    nodeset.expand: "(pattern: 'str', *, sort: 'bool' = True) -> 'list[str]'",
    nodeset.fold: "(names: 'Iterable[str]') -> 'str'",
    select.select_hosts: "(inv: 'Inventory', pattern: 'str', failed: 'Collection[str] | None' = None) -> 'list[Host]'",
    ansible.import_ansible: "(path: 'str | Path') -> 'AnsibleImport'",
}


def test_public_signatures_are_pinned() -> None:
    for fn, expected in API.items():
        assert str(inspect.signature(fn)) == expected, fn.__qualname__


def test_nodeset_error_is_a_selection_error_and_value_error() -> None:
    from clusterctl.errors import SelectionError

    assert issubclass(nodeset.NodeSetError, SelectionError)
    assert issubclass(nodeset.NodeSetError, ValueError)
