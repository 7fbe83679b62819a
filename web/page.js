() => {
  // ConvNN Explorer's page beyond Gradio's defaults (app.launch passes this as the page's js).
  const isNumberBox = (target) => target instanceof HTMLInputElement && target.type === "number";
  // A number box (a knob, a slider's box) applies a typed value when it loses focus (app.REFRESH): Enter leaves
  // the box, which applies the value (hops 3 typed and Enter still drew 2 hops).
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && isNumberBox(event.target)) event.target.blur();
  });
  // A number box's text goes to Gradio when the box is left, not at each key: while the user typed, Gradio's box
  // wrote its reading of the text back into it, and the next keys landed there. The browser gives a text that is not
  // a number yet ("1e" on the way to "1e30", "-" before "-5") as "", which emptied the box, and 1e3 came back as 1000:
  // 1e30 typed quickly gave K = 30 or 10000, and -5 gave 5. A box left with text that is not a number ("1e" and
  // Enter) is refused here, as the server refuses a number out of range: it goes back to the text it had when it got
  // focus, nothing is sent, and a message under it says why.
  const before = new WeakMap();  // a number box → its text when it got focus
  const refusal = document.createElement("p");
  refusal.className = "number-refused";
  refusal.setAttribute("role", "alert");
  document.addEventListener("focus", (event) => {
    if (!isNumberBox(event.target)) return;
    before.set(event.target, event.target.value);
    refusal.remove();
  }, true);
  document.addEventListener("input", (event) => {
    if (isNumberBox(event.target) && event.isTrusted) event.stopImmediatePropagation();  // a key, not a script
  }, true);
  document.addEventListener("blur", (event) => {
    const box = event.target;
    if (!isNumberBox(box)) return;
    if (!box.validity.badInput) {  // Gradio's value read from the text; then Gradio's blur sends it
      box.dispatchEvent(new Event("input", {bubbles: true}));
      return;
    }
    event.stopImmediatePropagation();  // no blur for Gradio: nothing is sent
    box.value = before.get(box) ?? "";  // Gradio's value, which no key changed
    const name = box.getAttribute("aria-label").replace(/^number input for /, "");  // a slider's box says so
    refusal.textContent = `${name} must be a number: what was typed is not one, so it was not applied (the box ` +
      `shows ${box.value || "nothing"} again).`;
    box.closest("div.block").append(refusal);  // its block (the label element is one too)
  }, true);
  // The lesson list, like every Gradio dropdown, sends `input` whenever it loses focus, whether a lesson was picked
  // or not: opening it and leaving without a pick restarted the lesson at step 1. Gradio picks on a press on an
  // option (mousedown, a tap's too) or on Enter, and then takes the focus from the list at once; a blur right after
  // one of them is a pick, any other blur is not (a press that picked nothing, Enter on text that names no lesson,
  // Tab or a click elsewhere later). The blur says which before Gradio sends its `input`, and the lesson starts only
  // after a pick (app_texts.LESSON_PICKED_JS); picking the lesson already open starts it again.
  const lessonInput = () => document.querySelector("#lesson input");
  const PICK_MS = 100;  // a pick's blur follows its press within Gradio's own handler
  let pressedAt = -Infinity;
  window.convnnLessonPicked = false;
  document.addEventListener("mousedown", (event) => {
    const list = event.target instanceof Element && event.target.closest("[role=option]")?.closest("[role=listbox]");
    if (list && list.id === lessonInput()?.getAttribute("aria-controls")) pressedAt = performance.now();
  }, true);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && event.target === lessonInput()) pressedAt = performance.now();
  }, true);
  document.addEventListener("blur", (event) => {
    if (event.target === lessonInput()) window.convnnLessonPicked = performance.now() - pressedAt < PICK_MS;
  }, true);
  // The user's presses, keys and scrolls, counted: a lesson's step that opens a tab scrolls to it once its views are
  // drawn, seconds later on a phone, only if the user has done nothing since asking for the step (the count then,
  // app_texts.STEP_ASKED); the page jumped away from where they were reading or picking meanwhile.
  window.convnnInputs = 0;
  for (const type of ["pointerdown", "keydown", "wheel", "touchmove"]) {
    document.addEventListener(type, () => { window.convnnInputs += 1; }, {capture: true, passive: true});
  }
  // onChange() now and whenever the elements inside the one of `selector` change: each watched where it is (the page's
  // whole body was watched, and every click in the explorer, which redraws its own elements, ran both below). Gradio
  // has drawn the page when it runs this script; an element it has not drawn yet is watched for until it has.
  const watch = (selector, onChange) => {
    const element = document.querySelector(selector);
    if (!element) {
      const waiting = new MutationObserver(() => {
        if (!document.querySelector(selector)) return;
        waiting.disconnect();
        watch(selector, onChange);
      });
      waiting.observe(document.body, {childList: true, subtree: true});
      return;
    }
    onChange();
    new MutationObserver(onChange).observe(element, {childList: true, subtree: true});
  };
  // The example thumbnails: Gradio's gallery names each one's button "Thumbnail n of 20" (and names it so again as it
  // redraws), though its image's alt text is the example's name (app.build_layout): each button is named by its image
  // (aria-labelledby, which Gradio does not set), again whenever the gallery's elements change.
  const nameThumbnails = () => document.querySelectorAll("#examples .thumbnail-item").forEach((button, index) => {
    const image = button.querySelector("img");
    if (!image) return;
    image.id ||= `example_thumbnail_${index}`;
    if (button.getAttribute("aria-labelledby") !== image.id) button.setAttribute("aria-labelledby", image.id);
  });
  // The layer list's choice, whole: a box shows one line, and a layer's name and facts ("blocks.0.attn ·
  // ConvNN-attention K=16 · random · 8×8 patches + CLS") were cut before the grid. The box's text is drawn by a block
  // under it that wraps (the box grows to its lines, the box itself over it: web/page.css), kept to the box's text
  // whether Gradio or a key sets it; while a name is typed (data-typed), the box shows it.
  const wholeText = (box) => {
    if (box.nextElementSibling?.classList.contains("whole-text")) return;
    const whole = document.createElement("div");
    whole.className = "whole-text";
    whole.setAttribute("aria-hidden", "true");  // the box says it
    whole.textContent = box.value;
    box.after(whole);
    const {get, set} = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, "value");
    Object.defineProperty(box, "value", {get() { return get.call(box); },
                                         set(text) { set.call(box, text); whole.textContent = get.call(box); }});
    box.addEventListener("input", () => { box.dataset.typed = ""; whole.textContent = box.value; });
    box.addEventListener("blur", () => { delete box.dataset.typed; });
  };
  watch("#examples", nameThumbnails);
  watch("#layer", () => document.querySelectorAll("#layer input").forEach(wholeText));
}
