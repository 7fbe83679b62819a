() => {
  // ConvNN Explorer's page beyond Gradio's defaults (app.launch passes this as the page's js).
  // A slider's number box applies a typed value when it loses focus, not on Enter, as every other box does
  // (hops 3 typed and Enter still drew 2 hops): Enter leaves the box, which applies the value.
  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (event.key === "Enter" && box instanceof HTMLInputElement && box.type === "number" &&
        box.closest(".block")?.querySelector("input[type=range]")) box.blur();
  });
}
