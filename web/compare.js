// Compare mode: 2–4 models in columns on the same image, one click, tap or hover (or the explorer's query) driving
// them all; a click or tap also moves the explorer's query to that place of the image ("cc-query").
//
// Run by Gradio's gr.HTML after web/panel.js, in one js_on_load(element, trigger, props, server, upload, watch) body.
// The server sends each column's neighbour table (analysis/rendering/page.py's value, one per model and layer:
// analysis/views/compare.py); a click in any column maps the pixel onto every other model's input by its place in
// the image (as analysis.map_pixel does) and onto each layer's grid (as analysis.query_cell does), and redraws every
// column from its table: nothing reaches the server.

const COLUMN_MAX_PX = 300; // each column's largest panel width
const COLUMN_MIN_PX = 140; // a phone (390 px) shows two columns side by side
const COLUMN_GAP_PX = 12; // .cc-cols's gap
const RULES = [["layer", "what each layer used"], ["window", "window"], ["all", "all tokens"],
               ["random", "random candidates"], ["blend", "blend"]]; // the rule every column shows

const NOTE = "Click or tap a pixel in any column: every model answers at the same place of the image.";

const root = element.querySelector(".cc");
root.innerHTML = `
  <div class="cc-rules cx-rules" role="tablist" aria-label="selection rule every column shows"></div>
  <div class="cc-cols"></div>
  <div class="cc-note"></div>`;
let table = null; // panel.js reads these two: set to a column's table and query before drawing it
let query = null;
let columns = []; // {table, query, el, canvas, caption, frame}
let rule = "layer";
let drawCount = 0;
let clicked = null; // [px, input size] of the last click, which a hover previews over and returns to
let hoverFrame = 0;
let echo = false; // true while the explorer follows a click of this view

function layout() { // as many columns side by side as fit (two on a phone), each panel as wide as its column
  const available = root.clientWidth || COLUMN_MAX_PX * columns.length;
  const perRow = Math.max(1, Math.min(columns.length, Math.floor((available + COLUMN_GAP_PX) /
                                                                 (COLUMN_MIN_PX + COLUMN_GAP_PX))));
  root.querySelector(".cc-cols").style.gridTemplateColumns = `repeat(${perRow}, minmax(0, 1fr))`;
  return Math.min(COLUMN_MAX_PX, (available - COLUMN_GAP_PX * (perRow - 1)) / perRow);
}

function spanRatio(t) { // the panel's side (the input and its padding cells) over the input's
  const edges = (e) => e[e.length - 1] - e[0];
  return Math.max(edges(t.row_edges_px), edges(t.col_edges_px)) / t.input_size;
}

function drawColumn(column, imageWidth) {
  table = column.table;
  query = column.query;
  const row = rowOf(cellOf(query));
  const selection = table.byName[rule] || table.byName.layer;
  column.frame = drawPanel(column.canvas, imageWidth * spanRatio(table), selection, row,
                           {labels: false, lines: true});
  const [name, probability] = table.prediction[0] || ["—", NaN];
  const cell = cellOf(query);
  column.caption.replaceChildren(
    Object.assign(document.createElement("div"), {className: "cc-model", textContent: table.model}),
    Object.assign(document.createElement("div"), {className: "cc-layer", textContent: table.label}),
    Object.assign(document.createElement("div"), {
      textContent: `predicts ${name} (${format(100 * probability)} %) · query pixel (${query.join(", ")}) → cell ` +
        `(${cell.join(", ")})`}),
    Object.assign(document.createElement("div"), {
      className: "cc-stats", textContent: row < 0 ? "" : `${selection.title}: mean distance ` +
        `${format(selection.meanDistance[row])} cells · ${format(100 * selection.windowShare[row])} % in ` +
        `${table.options.window_size}×${table.options.window_size}`}));
  Object.assign(column.el.dataset, {
    model: table.model, layer: table.layer, query: query.join(","), cell: cell.join(","), rule: selection.name,
    neighbors: JSON.stringify(row < 0 ? null : neighbors(selection, row).map((n) => n.cell)),
  });
}

function drawRules() {
  const bar = root.querySelector(".cc-rules");
  bar.replaceChildren(...RULES.map(([name, title]) => {
    const button = Object.assign(document.createElement("button"), {type: "button", textContent: title});
    button.setAttribute("role", "tab");
    button.setAttribute("aria-selected", String(name === rule));
    button.addEventListener("click", () => { rule = name; drawAll(); });
    return button;
  }));
}

function drawAll() {
  if (!columns.length) return;
  drawRules();
  // Every column shows the image at one size (the layers' padding rings differ), the widest panel filling its column.
  const imageWidth = layout() / Math.max(...columns.map((column) => spanRatio(column.table)));
  for (const column of columns) drawColumn(column, imageWidth);
  root.dataset.rule = rule;
  root.dataset.columns = String(columns.length);
  root.dataset.drawn = String(++drawCount); // last: a watcher of this attribute sees every column drawn
}

function setQuery(px, size) {
  for (const column of columns) column.query = mapPixel(px, size, column.table.input_size);
  drawAll();
}

function pixelUnder(column, event) { // the model-input pixel of `column` nearest to the pointer
  const box = column.canvas.getBoundingClientRect();
  table = column.table;
  return pixelAt(column.frame, event.clientX - box.left, event.clientY - box.top);
}

function onClick(column, event) { // every column, and the explorer (so that a copied link holds the pixel)
  const px = pixelUnder(column, event);
  clicked = [px, column.table.input_size];
  setQuery(...clicked);
  echo = true; // the explorer's answer (a "cx-query" of the same place) is not a new click
  document.dispatchEvent(new CustomEvent("cc-query", {detail: {px: [...px], size: column.table.input_size}}));
  echo = false;
}

function onHover(column, event) { // a mouse over a column previews that pixel in every column; leaving restores
  if (event.pointerType !== "mouse" || hoverFrame) return;
  hoverFrame = requestAnimationFrame(() => {
    hoverFrame = 0;
    setQuery(pixelUnder(column, event), column.table.input_size);
  });
}

function show() {
  const value = props.value;
  if (!value || !Array.isArray(value.columns)) return;
  const place = root.querySelector(".cc-cols");
  root.querySelector(".cc-note").textContent = value.note || NOTE;
  columns = value.columns.map((entry) => {
    const el = Object.assign(document.createElement("figure"), {className: "cc-col"});
    const canvas = Object.assign(document.createElement("canvas"), {className: "cc-canvas"});
    canvas.setAttribute("aria-label", `${entry.model}: click or tap a pixel`);
    const caption = document.createElement("figcaption");
    el.append(canvas, caption);
    const column = {el, canvas, caption, query: entry.query_px, frame: null};
    column.table = decodeTable(entry, () => drawAll());
    canvas.addEventListener("click", (event) => onClick(column, event));
    canvas.addEventListener("pointermove", (event) => onHover(column, event));
    canvas.addEventListener("pointerleave", () => setQuery(...clicked));
    return column;
  });
  place.replaceChildren(...columns.map((column) => column.el));
  root.dataset.columns = String(columns.length); // 0: no columns left to draw
  root.querySelector(".cc-rules").hidden = !columns.length;
  if (!columns.length) return;
  clicked = clicked || [columns[0].query, columns[0].table.input_size]; // a new table keeps the clicked pixel
  setQuery(...clicked);
}

document.addEventListener("cx-query", (event) => {
  if (!columns.length || echo) return;
  clicked = [event.detail.px, event.detail.size];
  setQuery(...clicked);
});
new ResizeObserver(() => drawAll()).observe(root);
watch("value", show);
show();
