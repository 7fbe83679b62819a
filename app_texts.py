"""The explorer page's own words and snippets: the guided mode's steps, the tabs' labels, the slow views' prompts,
the link's note, and the few lines of JavaScript its events run in the page (``app.py`` lays them out)."""

from __future__ import annotations

import json

from analysis import GRADIENT_NOTE

GUIDE = [
    "**1 · Pick a model and an image.** Each card says how much of the network is ConvNN (λ) and how it selects.",
    "**2 · Read the prediction** beside the image: the five most probable classes for what the model sees.",
    "**3 · Click or tap a pixel.** The large panel outlines the K cells one rule picks for it, rank 0 darkest; "
    "hover a cell for its rank, score and contribution.",
    "**4 · Compare rules.** Window = convolution, all tokens = attention, random = r sampled candidates, blend = α: "
    "switch the large panel, or read the small ones.",
    "**5 · Open the tabs** below: how neighbours are weighed, how the branches mix, and where the model looks.",
]
TABS = {"weights": "Aggregation weights", "mix": "λ mix", "attribution": "Attribution", "spectrum": "Spectrum",
        "compare": "Compare models", "equivalence": "Equivalence demo", "hops": "Multi-hop",
        "pixels": "Input-level view"}  # id → label
# A link or a lesson's step that opens a tab (?tab=compare, a step's tab=mix): the tab, below the explorer, is
# scrolled into view once its views are drawn, if the tab it names is the one open (not one it named in vain) and, for
# a link, the visitor has not scrolled meanwhile (a step is asked for from wherever the lesson's buttons are). What it
# names is read from the rule it sent the explorer (its focus_rule: "rule@its query string@a token", new at each
# opening, the input of these snippets); each opening is shown once (Next past a lesson's last step opens nothing).
_OPEN_TAB_JS = 'document.querySelector("#tabs [role=tab][aria-selected=true]")?.textContent.trim()'  # its label
_SHOW_TAB_JS = """(opened) => {
  const tabs = document.querySelector("#tabs");
  if (!opened || opened === tabs.dataset.shown) return;
  tabs.dataset.shown = opened;
  const tab = TABS[new URLSearchParams(opened.split("@")[1]).get("tab")];
  if (tab && tab === OPEN_TAB && UNMOVED) tabs.scrollIntoView();
}""".replace("TABS", json.dumps(TABS)).replace("OPEN_TAB", _OPEN_TAB_JS)
SHOW_TAB_JS = _SHOW_TAB_JS.replace("UNMOVED", "window.scrollY === 0")  # after a link's views
# after a lesson's step's, if the user has pressed, typed or scrolled nothing since asking for it (web/page.js counts)
SHOW_STEP_TAB_JS = _SHOW_TAB_JS.replace("UNMOVED", "window.convnnInputs === window.convnnStepInputs")
LINK_NOTE = "Links name a shipped model and an example image (an uploaded photo or checkpoint stays on this server)."
LESSON_PROMPT = ("Pick a lesson: each step sets the model, the image, the layer and the pixel, and says in plain words "
                 "what to look at.")
NO_MODEL = ("**No model of this server's checkpoint folder opens**: open your own below, under “Model card, or open "
            "your own checkpoint” (a `.safetensors` file and its `.json` card), or start the app on a folder of "
            "checkpoints (`python app.py --checkpoints FOLDER`).")  # beside the model list, instead of every view
LESSON_MISSING = "Pick a lesson first, in the list beside Back and Next."
# a lesson's text once the user picks an image or a model of their own
LESSON_ASIDE = ("**Step {step}** is about the lesson's {what}; the view now shows the {what} you picked. "
                "**◀ Back** or **Next step ▶** returns to the lesson, on its image and model.")
LINK_WARNING = ("This link could not set everything it names: the note under “Copy a link to this view” says what. "
                "The rest of the view is open.")
ATTRIBUTION_PROMPT = (f"Pick a method and press **Compute attribution**: it runs on demand (a few seconds for "
                      f"occlusion and integrated gradients) and is kept for this model and image. {GRADIENT_NOTE}")
ATTRIBUTION_CANCELLED = "Cancelled. Press **Compute attribution** to run it again."
EQUIVALENCE_PROMPT = "Press the button to compare on the chosen layer's features of this model and image."
# Said by a view of a random-candidate model, whose every view shows one eval draw (the draw box beside the explorer)
DRAW_SHOWN = ("This model draws random candidates: this is its eval draw {draw}, one of many equally valid answers "
              "(◀ ▶ beside the explorer step through them).")
HOPS_INTRO = ("Neighbours of neighbours, towards the input: the pixels the clicked query reaches through consecutive "
              "layers' selections (follows the click above).")
PIXELS_INTRO = "No trained model: each pixel's colour (+ position) is its feature. Click a pixel."

# The values a view shown was made from, kept in the page under a name (on the view's .change, run in the page): the
# explorer's knobs, compare mode's depth. A refused value is put back to them, so that the next change of another
# control is not refused for it again, and a copied link names what is shown.
KEEP_JS = "(...values) => {{ window.{kept} = values; }}"
RESTORE_JS = "(...values) => window.{kept} ?? values"
KEEP_KNOBS_JS, RESTORE_KNOBS_JS = KEEP_JS.format(kept="convnnKnobs"), RESTORE_JS.format(kept="convnnKnobs")
RESTORE_MODEL_JS = "(opened) => opened"  # a refused model name: the list names the model opened (app.RESTORED)
KEEP_DEPTH_JS, RESTORE_DEPTH_JS = KEEP_JS.format(kept="convnnDepth"), RESTORE_JS.format(kept="convnnDepth")
# A lesson's step asked for (Back, Next, a lesson picked): the user's inputs counted so far (SHOW_STEP_TAB_JS)
STEP_ASKED = "window.convnnStepInputs = window.convnnInputs;"
STEP_ASKED_JS = f"(...values) => {{ {STEP_ASKED} return values; }}"
# The lesson list's `input` (sent whenever the list loses focus) starts a lesson only where the blur was Gradio's own
# right after a pick (web/page.js notes it): else the lesson (the step's input at ``at``, app.build_demo) is sent as
# None, and the step changes nothing.
LESSON_PICKED_JS = ("(...values) => {{ " + STEP_ASKED +
                    " values[{at}] = window.convnnLessonPicked ? values[{at}] : null; return values; }}")
RESTORE_LAYER_JS = "() => document.querySelector('#explorer .cx')?.dataset.layer"  # a refused layer: the one shown
# A copied link and its note are of the view they were copied from: once the view changes (what the explorer shows,
# the open tab, compare mode's models or depth), both are cleared (a link to a view no longer shown stayed there);
# with no link copied, the note of the link the page opened stays. The link's answer names what the server read
# when it was asked for (the boxes, the tab), but the clicked pixel and the open tab move in the page alone: the
# page's pixel and tab when a link is asked for are kept on the link's row (data-asked, ASK_LINK_JS), and an answer
# that comes after either moved is dropped (COPY_LINK_JS) rather than written back over the cleared box. A knob, a
# model or a depth typed and then "Copy a link" clicked (its blur redraws the view while the link is asked for) is
# in the answer already: the link is kept.
CLEAR_LINK_JS = "(link, note) => link ? ['', ''] : [link, note]"
_PAGE_VIEW_JS = f'JSON.stringify([document.querySelector("#explorer .cx")?.dataset.query, {_OPEN_TAB_JS}])'
ASK_LINK_JS = """(...values) => {
  document.querySelector("#link_row").dataset.asked = PAGE_VIEW;
  return values;
}""".replace("PAGE_VIEW", _PAGE_VIEW_JS)
# The page's address with a view's query string, copied to the clipboard where the browser allows it; none for a
# view no longer shown (the link and its note cleared, as the view's move cleared them). The rule shown large is the
# page's; so is α while "▶ α" shows one of its frames there (the explorer's data-alpha): the link opens on that
# frame (its blend rule at that α), not on the knob's α.
COPY_LINK_JS = """(query, note) => {
  if (document.querySelector("#link_row").dataset.asked !== PAGE_VIEW) return ["", ""];
  const {rule, alpha} = document.querySelector("#explorer .cx")?.dataset ?? {};
  const knobs = alpha ? query.split("&").filter((pair) => !pair.startsWith("alpha=")).join("&") : query;
  const url = `${location.origin}${location.pathname}?${knobs}${rule ? `&rule=${rule}` : ""}` +
    (alpha ? `&alpha=${alpha}` : "");
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  return [url, note];
}""".replace("PAGE_VIEW", _PAGE_VIEW_JS)
