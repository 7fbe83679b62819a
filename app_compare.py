"""Compare mode's handlers (a mixin of :class:`app.Explorer`): the columns' models and layers, and each column's
neighbour table at the query's pixel, as the page's explorer gets it (:mod:`analysis.views.compare`)."""

from __future__ import annotations

import gradio as gr

import analysis as an
from server import user_errors

COMPARE_LAYERS = [f"compare_layer_{i}" for i in range(an.MAX_COMPARED)]  # each column's layer


class CompareMode:
    """Compare mode's handlers, on the explorer they are mixed into (its ``compared``, ``loaded``, ``table`` and
    ``too_few`` come from :class:`app_api.ExplorerAPI`)."""

    @staticmethod
    def on_compare_pick(compare_models, request=None):
        """Compare mode's list as the user picked it, to :data:`analysis.MAX_COMPARED` models: a model picked past
        them is not added, and the page says so (the list's own limit dropped it silently)."""
        if not isinstance(compare_models, list) or len(compare_models) <= an.MAX_COMPARED:
            return gr.skip()
        gr.Warning(f"Compare mode shows {an.MAX_COMPARED} models at most: remove one to add another.")
        return compare_models[:an.MAX_COMPARED]

    def opening_depth(self, checkpoint, layer, request=None) -> float:
        """The depth compare mode opens at: the explorer's layer's (:func:`analysis.layer_depth`), so that the columns
        open where the explorer is, the explorer's model at its very layer (they opened at the depth last set,
        another layer)."""
        return an.layer_depth(self.model(checkpoint, request), layer)

    @user_errors
    def on_compare_open(self, checkpoint, layer, tab, request=None):
        """Compare mode opened from ``tab``, the tab open before (its select keeps ``tab``, as every tab's does), at
        its :meth:`opening_depth`. A link or a lesson's step that opens compare mode has set ``tab`` to it already,
        with its depth (its own, else the same opening depth: ``app.Explorer.view``), which stays: its select fires
        too, and a depth set here raced the link's own."""
        if tab == "compare":
            return {"compare_depth": gr.skip(), "tab": gr.skip()}
        return {"compare_depth": self.opening_depth(checkpoint, layer, request), "tab": "compare"}

    @user_errors
    def on_compare_layers(self, compare_models, compare_depth, request=None):
        """Each column's layer list, set to the layer ``compare_depth`` of the way through its model."""
        if self.too_few(compare_models):
            return {name: gr.update(visible=False) for name in COMPARE_LAYERS}
        models = self.compared(compare_models, request)
        updates = {name: gr.update(visible=False) for name in COMPARE_LAYERS[len(models):]}
        for name, loaded in zip(COMPARE_LAYERS, models, strict=False):
            short = [(f"{layer_info.name} · {layer_info.height}×{layer_info.width}", layer_info.name)
                     for layer_info in loaded.layer_infos]  # caption: the rest
            updates[name] = gr.update(choices=short, value=an.layer_at_depth(loaded, compare_depth).name,
                                      visible=True, label=f"{loaded.card.name}: layer")
        return updates

    @user_errors
    def on_compare(self, compare_models, compare_layer_0, compare_layer_1, compare_layer_2, compare_layer_3, query,
                   request=None):
        """Compare mode's value (:class:`app_components.CompareView`): each column's neighbour table (the page's, as
        the explorer gets it), each layer's own K, R and r, at the query's pixel mapped onto each model's input by
        its place in the image, in the explorer's eval draw (a random-candidate model's column stayed on draw 0 while
        the explorer showed another), and ``query_size``, the input size of the explorer's model, in which the page
        holds the query; with fewer than 2 models, no columns and a note."""
        if self.too_few(compare_models):
            return {"columns": [], "note": f"Pick 2 to {an.MAX_COMPARED} models to compare."}
        size = self.model(query.checkpoint, request).card.input_size
        pixel = query.at(query.pixel, size).pixel
        columns, layers = [], [compare_layer_0, compare_layer_1, compare_layer_2, compare_layer_3]
        for checkpoint, loaded, layer in zip(compare_models, self.compared(compare_models, request), layers,
                                             strict=False):
            column = an.Query(checkpoint=checkpoint, image_file=query.image_file, fit=query.fit, layer=layer,
                              draw=query.draw)
            columns.append(self.table(column.at(an.map_pixel(pixel, size, loaded.card.input_size)), request,
                                      keep_query=False))
        return {"columns": columns, "query_size": size}

    def on_compare_layers_if_open(self, compare_models, compare_depth, tab, request=None):
        """:meth:`on_compare_layers` after a link or a lesson's step that opens compare mode (``tab=compare``), so
        that the columns follow (:meth:`on_compare_if_open`); nothing when another tab is open."""
        if tab != "compare":
            return {name: gr.skip() for name in COMPARE_LAYERS}
        return self.on_compare_layers(compare_models, compare_depth, request)

    def on_compare_if_open(self, compare_models, compare_layer_0, compare_layer_1, compare_layer_2, compare_layer_3,
                           query, tab, request=None):
        """:meth:`on_compare` for a new image while compare mode is the open tab; nothing otherwise."""
        if tab != "compare":
            return gr.skip()
        return self.on_compare(compare_models, compare_layer_0, compare_layer_1, compare_layer_2, compare_layer_3,
                               query, request)
