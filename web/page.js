() => {
  // ConvNN Explorer's page beyond Gradio's defaults (app.launch passes this as the page's js).
  // A number box (a knob, a slider's box) applies a typed value when it loses focus (app.REFRESH): Enter leaves
  // the box, which applies the value (hops 3 typed and Enter still drew 2 hops).
  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (event.key === "Enter" && box instanceof HTMLInputElement && box.type === "number") box.blur();
  });
}
