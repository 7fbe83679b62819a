// Compare mode (app_components.CompareView): 2–4 models in columns on the same image, one query driving them all.
//
// The body of the component's js_on_load(element, trigger, props, server, upload, watch), after web/panel.js. The
// server sends each column's neighbour table (analysis/rendering/page.py's value, one per model and layer:
// analysis/views/compare.py) and `query_size`, the input size of the explorer's model, in which the query boxes
// (its root's data-query-boxes) hold the query. The columns show the query of the boxes, mapped onto each model's input by
// its place in the image (as analysis.map_pixel does) and onto each layer's grid (as analysis.query_cell does); a
// click or a tap in a column writes its pixel there (so the explorer and a copied link follow), and a mouse over a
// column previews its pixel in every column. Nothing reaches the server. The rule bar is the tables' own rules.

const COLUMN_MAX_PX = 300; // each column's largest panel width
const COLUMN_MIN_PX = 140; // a phone (390 px) shows two columns side by side
const COLUMN_GAP_PX = 12; // .cc-cols's gap

const NOTE = "Click or tap a pixel in any column: every model answers at the same place of the image.";

const root = element.querySelector(".cc");
root.innerHTML = `
  <div class="cc-rules cx-rules" role="tablist" aria-label="selection rule every column shows"></div>
  <div class="cc-cols"></div>
  <div class="cc-note"></div>`;
const boxes = root.dataset.queryBoxes.split(" "); // the elem_ids of the query's row and col boxes
const followed = new WeakSet(); // the boxes this view follows (panel.js: followQuery)
let columns = []; // {table, el, canvas, caption, frame}
let querySize = 0; // the input size of the explorer's model: the boxes' pixels are of it
let rule = "layer";
let drawCount = 0;
let clicked = null; // {px, size}: the pixel last clicked in a column, shown while the boxes hold it (mapped)
let hovered = null; // {px, size}: the pixel a mouse previews, or null
let hoverFrame = 0;

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

function source() { // {px, size}: the pixel every column shows, before it is mapped onto each column's input
  if (hovered) return hovered;
  const px = readQuery(boxes);
  if (!px || !querySize || px[0] >= querySize || px[1] >= querySize) return clicked;
  // a click in a column is kept at its own input's precision while the boxes hold it
  if (clicked && samePixel(mapPixel(clicked.px, clicked.size, querySize), px)) return clicked;
  return {px, size: querySize};
}

function drawColumn(column, panelWidth, ratio, shown) { // its panel `panelWidth` wide, spanning `ratio` × its input
  const table = column.table;
  const query = mapPixel(shown.px, shown.size, table.input_size);
  const row = rowOf(table, cellOf(table, query));
  const selection = table.byName[rule] || table.byName.layer;
  column.frame = drawPanel(column.canvas, table, query, panelWidth, selection, row,
                           {labels: false, lines: true, span: ratio * table.input_size});
  const [name, probability] = table.prediction[0] || ["—", NaN];
  const cell = cellOf(table, query);
  column.caption.replaceChildren(
    Object.assign(document.createElement("div"), {className: "cc-model", textContent: table.model}),
    Object.assign(document.createElement("div"), {className: "cc-layer", textContent: table.label}),
    Object.assign(document.createElement("div"), {
      textContent: `predicts ${name} (${format(100 * probability, 1)}%` +
        `${table.draw === null || table.draw === undefined ? "" : `, draw ${table.draw}`}) · query pixel ` +
        `(${query.join(", ")}) → cell (${cell.join(", ")})`}),
    Object.assign(document.createElement("div"), {
      className: "cc-stats", textContent: row < 0 ? "" : `${selection.title}: mean distance ` +
        `${format(selection.meanDistance[row])} cells · ${format(100 * selection.windowShare[row])} % in ` +
        `${table.options.window_size}×${table.options.window_size}`}));
  Object.assign(column.el.dataset, {
    model: table.model, layer: table.layer, query: query.join(","), cell: cell.join(","), rule: selection.name,
    imageWidth: String(column.frame.scale * table.input_size), // CSS px, the same in every column
    neighbors: JSON.stringify(row < 0 ? null : neighbors(selection, row).map((n) => n.cell)),
  });
}

function drawRules() { // one button per rule of the tables (the registry's, then what each layer used)
  const bar = root.querySelector(".cc-rules");
  bar.replaceChildren(...columns[0].table.rules.map(({name, title}) => {
    const button = Object.assign(document.createElement("button"), {type: "button", textContent: title});
    button.dataset.rule = name;
    button.setAttribute("role", "tab");
    button.setAttribute("aria-selected", String(name === rule));
    button.addEventListener("click", () => { rule = name; drawAll(); });
    return button;
  }));
}

function drawAll() {
  const shown = columns.length ? source() : null;
  if (!shown) return;
  drawRules();
  // Every column shows the image at one size in a panel of one size, filling its column: the layers' padding rings
  // differ, and each panel spans the widest ring's, its own ring centred in it (the rest drawn as padding is).
  const ratio = Math.max(...columns.map((column) => spanRatio(column.table)));
  const panelWidth = layout();
  for (const column of columns) drawColumn(column, panelWidth, ratio, shown);
  root.dataset.rule = rule;
  root.dataset.columns = String(columns.length);
  root.dataset.drawn = String(++drawCount); // last: a watcher of this attribute sees every column drawn
}

function pixelUnder(column, event) { // {px, size}: the model-input pixel of `column` nearest to the pointer
  const box = column.canvas.getBoundingClientRect();
  const px = pixelAt(column.table, column.frame, event.clientX - box.left, event.clientY - box.top);
  return {px, size: column.table.input_size};
}

function onClick(column, event) { // every column, and the query's boxes (the explorer follows; a link holds it)
  clicked = pixelUnder(column, event);
  hovered = null;
  drawAll();
  if (querySize) writeQuery(boxes, mapPixel(clicked.px, clicked.size, querySize));
}

function onHover(column, event) { // a mouse over a column previews that pixel in every column; leaving restores
  if (event.pointerType !== "mouse" || hoverFrame) return;
  hoverFrame = requestAnimationFrame(() => {
    hoverFrame = 0;
    hovered = pixelUnder(column, event);
    drawAll();
  });
}

function onLeave() {
  cancelAnimationFrame(hoverFrame);
  hoverFrame = 0;
  hovered = null;
  drawAll();
}

function show() {
  const value = props.value;
  if (!value || !Array.isArray(value.columns)) return;
  const place = root.querySelector(".cc-cols");
  root.querySelector(".cc-note").textContent = value.note || NOTE;
  querySize = value.query_size || 0;
  columns = value.columns.map((entry) => {
    const el = Object.assign(document.createElement("figure"), {className: "cc-col"});
    const canvas = Object.assign(document.createElement("canvas"), {className: "cc-canvas"});
    canvas.setAttribute("aria-label", `${entry.model}: click or tap a pixel`);
    const caption = document.createElement("figcaption");
    el.append(canvas, caption);
    const column = {el, canvas, caption, frame: null};
    column.table = decodeTable(entry, () => drawAll());
    canvas.addEventListener("click", (event) => onClick(column, event));
    canvas.addEventListener("pointermove", (event) => onHover(column, event));
    canvas.addEventListener("pointerleave", onLeave);
    return column;
  });
  place.replaceChildren(...columns.map((column) => column.el));
  root.dataset.columns = String(columns.length); // 0: no columns left to draw
  root.querySelector(".cc-rules").hidden = !columns.length;
  if (!columns.length) return;
  clicked = clicked || {px: value.columns[0].query_px, size: columns[0].table.input_size};
  followQuery(boxes, followed, drawAll);
  drawAll();
}

new ResizeObserver(() => drawAll()).observe(root);
watch("value", show);
show();
