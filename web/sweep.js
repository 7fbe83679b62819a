// ConvNN Explorer: hands the α sweep the server sends (analysis/rendering/page.py: page_sweep) to the explorer
// (web/explorer.js), which plays it, as a "cx-sweep" event on the document.
//
// Run by Gradio's gr.HTML as the body of js_on_load(element, trigger, props, server, upload, watch); it shows nothing.

function send() {
  const value = props.value;
  if (value && typeof value === "object" && value.alphas) {
    document.dispatchEvent(new CustomEvent("cx-sweep", {detail: value}));
  }
}

watch("value", send);
