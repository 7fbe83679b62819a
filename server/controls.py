"""The page's inputs as the server checks them: number boxes and sliders that take only what they show
(:class:`CheckedNumber`, :class:`CheckedSlider`; :func:`control` makes one from a field of the view), and the errors
a user can cause shown as messages (:func:`user_errors`).

Gradio's private parts this module touches are listed in :data:`GRADIO_PRIVATE`, right below the imports
(``tests/server/test_gradio_private.py`` checks each on the installed Gradio; ``requirements.txt`` pins Gradio to
the minor versions it passed on).
"""

from __future__ import annotations

import functools
from unittest import mock

import gradio as gr
from gradio import component_meta

import analysis as an

__all__ = ["GRADIO_PRIVATE", "CheckedNumber", "CheckedSlider", "checked_number", "control", "user_errors"]

GRADIO_PRIVATE = {
    "component_meta.create_or_modify_pyi": "called by Gradio's component metaclass to write a .pyi stub beside the "
                                           "module of each component class; patched out while ours are made",
    "Block.get_block_name": "reads a class's is_template: a template's block is the one of the component it is "
                            "built from (how the page shows a CheckedNumber as Gradio's number box)",
}


def user_errors(fn):
    """Show the errors a user can cause (:func:`analysis.user_error_message`) as a message in the page."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            if (message := an.user_error_message(err)) is None:
                raise
            raise gr.Error(message, print_exception=False) from err
    return wrapper


def checked_number(payload: object, component: gr.Number | gr.Slider) -> int | float | None:
    """A number box's or slider's value as sent, checked before Gradio's own preprocessing: a whole number for a
    ``precision=0`` box (refused, not rounded, if fractional), else a finite real number, within the component's
    bounds; a number box's None stays None (an empty box).

    Raises:
        gr.Error: anything else (``NaN``, ``inf``, ``2.5`` for a whole number, ``"abc"``, ``[1]``), with the
            component's label and the value (:func:`analysis.user_error_message`). Gradio's own check rounded
            ``2.5`` and failed on the others with an empty error.
    """
    if payload is None and isinstance(component, gr.Number):
        return None
    check = an.whole_number if component.precision == 0 else an.real_number
    try:
        return check(payload, component.label, component.minimum, component.maximum)
    except ValueError as err:
        raise gr.Error(an.user_error_message(err), print_exception=False) from err


# Gradio writes a .pyi stub of every component class next to its source file (event signatures, for authors of
# custom components): for these two, which add no event, it would write a copy of this file into the repository.
with mock.patch.object(component_meta, "create_or_modify_pyi", lambda *args: None):
    class CheckedNumber(gr.Number):
        """A ``gr.Number`` that takes only the numbers :func:`checked_number` accepts (with ``precision=0``: whole
        ones, not rounded); the page shows it as the Gradio number box it is built from (a template: same arguments,
        and a session's copy made by an update is one too)."""

        is_template = True

        def preprocess(self, payload: object) -> int | float | None:
            return checked_number(payload, self)

    class CheckedSlider(gr.Slider):
        """A ``gr.Slider`` that takes only finite numbers in its range (:func:`checked_number`); the page shows it as
        the Gradio slider it is built from (a template: same arguments)."""

        is_template = True

        def preprocess(self, payload: object) -> float:
            return super().preprocess(checked_number(payload, self))




def control(view: type, name: str, **layout) -> CheckedNumber | CheckedSlider:
    """The control of the number field ``name`` of ``view`` (a :class:`analysis.Query` or :class:`analysis.ViewState`
    class), made from its :class:`analysis.Setting` (label and hint, bounds, a slider's step, whether it shows) and its
    default: a slider where the setting has a step, else a number box (whole numbers for a "whole" field), its
    ``elem_id`` the field's name; ``layout``: Gradio's layout arguments (``min_width``, ``scale``).

    Raises:
        StopIteration: ``view`` has no field ``name``.
    """
    item, how = next((item, how) for item, how in an.settings(view) if item.name == name)
    if how.step:
        return CheckedSlider(how.minimum, how.maximum, value=item.default, step=how.step, label=how.label,
                             info=how.info or None, elem_id=name, visible=how.visible, **layout)
    return CheckedNumber(item.default, precision=0 if how.kind == "whole" else None, minimum=how.minimum,
                         maximum=how.maximum, label=how.label, info=how.info or None, elem_id=name,
                         visible=how.visible, **layout)
