"""The REST API as an aiohttp application built by a factory, from one route table.

``build_app(facade)`` wires the seed-000 paths (and riqr's additions) to a ``Facade``; the HttpVerticle only
starts and stops it. ``ROUTES`` is the route table as data: the app is built from it, and so can be any
description of the API (its docs, an OpenAPI document), so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from runtime.facade import Facade
from runtime.rest import handlers as h
from runtime.rest.render import Handler, error_middleware

__all__ = ["build_app", "FACADE", "ROUTES", "Route"]

FACADE = h.FACADE


@dataclass(frozen=True)
class Route:
    """One GET path of the REST API: its aiohttp path pattern, handler, and a one-line summary."""

    path: str
    handler: Handler
    summary: str


ROUTES: tuple[Route, ...] = (
    Route("/metadata", h.metadata, "every query actor, as seed-000 metadata instances"),
    Route("/metadata/stores/{store}", h.metadata_for_store, "the instances holding a store"),
    Route("/metadata/stores/{store}/key/{key:.*}", h.metadata_for_key, "the instance owning a key's partition"),
    Route("/stores", h.catalog, "the store catalog: kinds, key and value schemas, partitions"),
    Route("/stores/{store}/all", h.all_entries, "every entry in key order"),
    Route("/stores/{store}/get/{key:.*}", h.get_key, "the value of one key"),
    Route("/stores/{store}/range", h.range_entries, "the entries between two keys, both inclusive"),
    Route("/stores/{store}/prefix/{prefix:.*}", h.prefix_entries, "the entries whose key starts with a prefix"),
    Route("/stores/{store}/windows", h.windows_of_range, "windows of a key range within a time range"),
    Route("/stores/{store}/windows/{key:.*}", h.windows_of_key, "windows of one key within a time range"),
    Route("/stores/{store}/sessions", h.sessions_of_range, "sessions of a key range"),
    Route("/stores/{store}/sessions/{key:.*}", h.sessions_of_key, "sessions of one key"),
    Route("/stores/{store}/approximate-num-entries", h.approximate_num_entries, "the number of entries"),
)


def build_app(facade: Facade) -> web.Application:
    """The REST application over ``facade``. Keys in paths may be empty and may contain ``/``."""
    app = web.Application(middlewares=[error_middleware])
    app[FACADE] = facade
    for route in ROUTES:
        app.router.add_get(route.path, route.handler)
    return app
