// The page's drawing library: decoding the packed arrays the server sends, the geometry between model-input
// pixels, cells and CSS pixels, the drawing of a panel (an image with a query's neighbours outlined), and the
// query's one home on the page.
//
// Pure functions, each given what it reads (a decoded table, a query [row_px, col_px], a canvas): no variable of
// its own and none of its caller's. app_components.py puts this file before each view's own script (explorer.js,
// compare.js, hops.js) in that view's js_on_load body, so every view has the same functions and no view shares a
// variable with another.

const PREFIX = -32768; // the packed cell of a prefix token (CLS): analysis/rendering/page.py's PREFIX_CELL
const LABEL_FONT_PX = 11; // rank numbers inside their cells at this size, smaller in narrower cells (0.7 of the
const LABEL_MIN_FONT_PX = 8; // cell's width) down to this size; narrower cells get lines + chips instead

function labelFontPx(cellPx) { // the size of the rank numbers drawn inside cells this wide (CSS px)
  return Math.min(LABEL_FONT_PX, Math.floor(cellPx * 0.7));
}

function decode(text, Type) { // a packed array (base64, little-endian) as a typed array of Type
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return new Type(bytes.buffer);
}

function decodeSelection(entry) {
  return {
    k: entry.k,
    cells: decode(entry.cells, Int16Array),
    scores: decode(entry.scores, Float32Array),
    candidates: entry.candidates ? decode(entry.candidates, Int16Array) : null,
  };
}

function loadImage(src, onImage) { // an Image of a data URL; onImage() once it has loaded
  const image = new Image();
  image.onload = onImage;
  image.src = src;
  return image;
}

function decodeTable(value, onImage) { // the page's value, its arrays decoded; onImage() once its image loads
  const [height, width] = value.grid;
  const t = {
    ...value, height, width,
    rules: value.rules.map((rule) => ({
      ...rule, ...decodeSelection(rule),
      meanDistance: decode(rule.mean_distance, Float32Array),
      windowShare: decode(rule.window_share, Float32Array),
    })),
    jaccard: Object.fromEntries(Object.entries(value.jaccard).map(([pair, v]) => [pair, decode(v, Float32Array)])),
    contributions: value.contributions ? decode(value.contributions, Float32Array) : null,
    branchShare: value.branch_share ? decode(value.branch_share, Float32Array) : null,
    heads: value.heads.map(decodeSelection),
    image: loadImage(value.image, onImage),
  };
  t.byName = Object.fromEntries(t.rules.map((rule) => [rule.name, rule]));
  return t;
}

function mapPixel(px, fromSize, toSize) { // the pixel holding the source pixel's centre (analysis.map_pixel)
  return px.map((p) => Math.min(toSize - 1, Math.floor((p + 0.5) * toSize / fromSize)));
}

function format(value, digits = 2) { // a number as the page shows it, "—" for NaN (no neighbour on the grid)
  return Number.isFinite(value) ? value.toFixed(digits) : "—";
}

function samePixel(a, b) {
  return Boolean(a && b) && a[0] === b[0] && a[1] === b[1];
}

// -- the query's one home: the page's query row and col boxes -----------------------------------------------------
// The server's views read the query pixel from the two number boxes (analysis.Query's row_px and col_px), links and
// lessons set it there, and every view of the page reads it there and writes a click there; a view keeps no query
// of its own. `ids` are the boxes' elem_ids (its root's data-query-boxes: app_components.PageView).

function queryBoxes(ids) {
  return ids.map((id) => document.querySelector(`#${id} input`));
}

function typedQuery(ids) { // the boxes' numbers [row_px, col_px] (NaN for an empty box: Number("") is 0, and an
  // empty box is no row), or null without boxes
  const boxes = queryBoxes(ids);
  return boxes.some((box) => !box) ? null : boxes.map((box) => (box.value.trim() === "" ? NaN : Number(box.value)));
}

function readQuery(ids) { // [row_px, col_px] as the boxes hold it, or null (no boxes, or not whole numbers ≥ 0)
  const px = typedQuery(ids);
  return px && px.every((p) => Number.isInteger(p) && p >= 0) ? px : null;
}

function clampPixel(px, size) { // the nearest pixel of a size × size input (analysis.clamp_px)
  return px.map((p) => Math.min(Math.max(p, 0), size - 1));
}

function writeQuery(ids, px) { // the boxes set to px ("input": Gradio's value; one "change": every view follows,
  // once, reading both boxes)
  const boxes = queryBoxes(ids);
  const changed = boxes.filter((box, axis) => box && box.value !== String(px[axis]));
  boxes.forEach((box, axis) => { if (box) box.value = String(px[axis]); });
  for (const box of changed) box.dispatchEvent(new Event("input", {bubbles: true}));
  changed.at(-1)?.dispatchEvent(new Event("change", {bubbles: true}));
}

function followQuery(ids, followed, onChange) { // onChange() when a box's value is entered (typed, or written)
  for (const box of queryBoxes(ids)) { // `followed`: a WeakSet of the boxes this view already follows
    if (box && !followed.has(box)) {
      followed.add(box);
      box.addEventListener("change", onChange);
    }
  }
}

// -- a table's rows ------------------------------------------------------------------------------------------------
function cellOf(table, px) { // the layer's cell [row, col] covering a model-input pixel
  return [table.row_cell_of_px[px[0]], table.col_cell_of_px[px[1]]];
}

function rowOf(table, cell) { // the table row of a query cell, or -1 when the table does not hold it
  const index = cell[0] * table.width + cell[1];
  if (table.queries == null) return index;
  return table.queries.indexOf(index);
}

function neighbors(selection, row) { // [{rank, cell: [r, c] or null (CLS), score}]
  const out = [];
  for (let t = 0; t < selection.k; t++) {
    const at = (row * selection.k + t) * 2;
    const r = selection.cells[at];
    out.push({rank: t, cell: r === PREFIX ? null : [r, selection.cells[at + 1]],
              score: selection.scores[row * selection.k + t]});
  }
  return out;
}

function candidates(selection) {
  if (!selection.candidates) return [];
  const out = [];
  for (let i = 0; i < selection.candidates.length; i += 2) {
    if (selection.candidates[i] !== PREFIX) out.push([selection.candidates[i], selection.candidates[i + 1]]);
  }
  return out;
}

// -- geometry: model-input pixels ↔ CSS pixels of a panel ---------------------------------------------------------
function frame(table, cssWidth, span = 0) { // a panel of `table` this wide: its padding, offset and scale (CSS px
  // per pixel); `span`: a side in model-input pixels larger than the table's own (the input and its padding cells),
  // which the panel then shows, square, the table's own centred in it
  const pad = table.padding;
  const ownY = table.row_edges_px[table.row_edges_px.length - 1] - table.row_edges_px[0];
  const ownX = table.col_edges_px[table.col_edges_px.length - 1] - table.col_edges_px[0];
  const spanY = Math.max(span, ownY);
  const spanX = Math.max(span, ownX);
  const top = (spanY - ownY) / 2 - table.row_edges_px[0];
  const left = (spanX - ownX) / 2 - table.col_edges_px[0];
  const scale = cssWidth / Math.max(spanX, spanY);
  return {pad, top, left, scale, width: spanX * scale, height: spanY * scale};
}

function rect(table, f, cell) { // a cell's rectangle in the panel's CSS pixels
  const r = cell[0] + f.pad;
  const c = cell[1] + f.pad;
  const y0 = (table.row_edges_px[r] + f.top) * f.scale;
  const x0 = (table.col_edges_px[c] + f.left) * f.scale;
  const y1 = (table.row_edges_px[r + 1] + f.top) * f.scale;
  const x1 = (table.col_edges_px[c + 1] + f.left) * f.scale;
  return {x: x0, y: y0, w: x1 - x0, h: y1 - y0};
}

function cellAt(table, f, x, y) { // CSS position → the cell [row, col] under it, padding cells included, or null
  const find = (edges, at) => {
    for (let i = 0; i + 1 < edges.length; i++) if (edges[i] <= at && at < edges[i + 1]) return i - f.pad;
    return null;
  };
  const row = find(table.row_edges_px, y / f.scale - f.top);
  const col = find(table.col_edges_px, x / f.scale - f.left);
  return row === null || col === null ? null : [row, col];
}

function pixelAt(table, f, x, y) { // CSS position → the model-input pixel [row, col] nearest to it: a position in
  // the padding frame snaps to the image's edge, so that its cell is the query cell nearest to the position
  const nearest = (at) => Math.min(Math.max(Math.floor(at), 0), table.input_size - 1);
  return [nearest(y / f.scale - f.top), nearest(x / f.scale - f.left)];
}

// -- drawing ----------------------------------------------------------------------------------------------------
function sized(table, canvas, cssWidth, span) { // the canvas sized for a panel this wide: its context and frame
  const f = frame(table, cssWidth, span);
  const ratio = window.devicePixelRatio || 1;
  canvas.style.width = `${f.width}px`;
  canvas.style.height = `${f.height}px`;
  canvas.width = Math.round(f.width * ratio);
  canvas.height = Math.round(f.height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return [ctx, f];
}

// One panel: the table's image, the query's cell outlined, and the neighbours `selection` gives it (its `row` of
// the table; -1: none held), drawn on `canvas` at `cssWidth`. Options: `labels` (rank numbers), `lines` (lines
// from the query where cells are too small for numbers), `span` (the side the panel shows, in model-input pixels, if
// more than the table's own: frame). Returns the frame, with `ranks` saying how the rank numbers were drawn:
// "inside:N" (in N cells), "chips:N", or "none".
function drawPanel(canvas, table, query, cssWidth, selection, row, options) {
  const [ctx, f] = sized(table, canvas, cssWidth, options.span);
  f.ranks = "none";
  ctx.fillStyle = "#3a3a3a"; // padding cells around the image (darker than a letterbox's grey bars)
  ctx.fillRect(0, 0, f.width, f.height);
  ctx.imageSmoothingEnabled = false;
  if (table.image.complete) {
    ctx.drawImage(table.image, f.left * f.scale, f.top * f.scale, table.input_size * f.scale,
                  table.input_size * f.scale);
  }
  const q = rect(table, f, cellOf(table, query));
  const qx = q.x + q.w / 2;
  const qy = q.y + q.h / 2;
  ctx.strokeStyle = table.candidate_color;
  ctx.lineWidth = 1;
  for (const c of candidates(selection)) {
    const r = rect(table, f, c);
    ctx.strokeRect(r.x + 0.5, r.y + 0.5, r.w - 1, r.h - 1);
  }
  if (row < 0) return f;
  const list = neighbors(selection, row).filter((n) => n.cell);
  const fontPx = labelFontPx(q.w);
  const small = fontPx < LABEL_MIN_FONT_PX;
  if (small && options.lines) {
    ctx.lineWidth = 1.5;
    for (const n of list) {
      const r = rect(table, f, n.cell);
      ctx.strokeStyle = table.colors[n.rank];
      ctx.beginPath();
      ctx.moveTo(qx, qy);
      ctx.lineTo(r.x + r.w / 2, r.y + r.h / 2);
      ctx.stroke();
    }
  }
  ctx.lineWidth = Math.max(1.5, Math.min(3, q.w / 6));
  for (const n of [...list].reverse()) { // rank 0 drawn last, on top
    const r = rect(table, f, n.cell);
    ctx.strokeStyle = table.colors[n.rank];
    ctx.strokeRect(r.x + ctx.lineWidth / 2, r.y + ctx.lineWidth / 2, r.w - ctx.lineWidth, r.h - ctx.lineWidth);
  }
  ctx.lineWidth = 2;
  ctx.strokeStyle = "#000";
  ctx.strokeRect(q.x - 1, q.y - 1, q.w + 2, q.h + 2);
  ctx.strokeStyle = "#fff";
  ctx.strokeRect(q.x - 3, q.y - 3, q.w + 6, q.h + 6);
  if (options.labels && selection.k <= table.max_labelled_ranks) {
    const drawn = drawRanks(ctx, table, f, list, small ? LABEL_FONT_PX : fontPx, small);
    f.ranks = `${small ? "chips" : "inside"}:${drawn}`;
  }
  return f;
}

function drawRanks(ctx, table, f, list, fontPx, small) { // returns how many numbers it drew
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  ctx.font = `600 ${fontPx}px system-ui, sans-serif`;
  const placed = [];
  let drawn = 0;
  for (const n of list) {
    const r = rect(table, f, n.cell);
    const x = r.x + r.w / 2;
    const y = r.y + r.h / 2;
    const label = String(n.rank);
    const w = Math.max(12, ctx.measureText(label).width + 5);
    if (small) { // a chip centred on the cell, skipped where an earlier (better) rank's chip already sits
      if (placed.some((p) => Math.abs(p[0] - x) < w - 2 && Math.abs(p[1] - y) < 12)) continue;
      placed.push([x, y]);
      ctx.fillStyle = "rgba(0, 0, 0, 0.72)";
      ctx.fillRect(x - w / 2, y - 7, w, 14);
      ctx.fillStyle = table.colors[n.rank];
      ctx.fillRect(x - w / 2, y + 5, w, 2);
    }
    ctx.lineWidth = fontPx * 0.27; // the outline that keeps a number legible on any image: 3 px at 11 px
    ctx.strokeStyle = "rgba(0, 0, 0, 0.85)";
    ctx.fillStyle = "#fff";
    if (!small) ctx.strokeText(label, x, y);
    ctx.fillText(label, x, y);
    drawn += 1;
  }
  return drawn;
}
