// One panel of the explorer drawn from a neighbour table: decoding the packed arrays, the geometry between
// model-input pixels, cells and CSS pixels, and the drawing of an image with a query's neighbours outlined.
//
// Shared by web/explorer.js and web/compare.js: app.py puts this file before each of them in one js_on_load body.
// The functions read that script's `table` (a decoded table: analysis/rendering/page.py's value) and `query`
// ([row_px, col_px]); the explorer has one of each, the compare view sets them to a column's before drawing it.

const PREFIX = -32768; // the packed cell of a prefix token (CLS)
const LABEL_FONT_PX = 11; // rank numbers inside their cells at this size, smaller in narrower cells (0.7 of the
const LABEL_MIN_FONT_PX = 8; // cell's width) down to this size; narrower cells get lines + chips instead

function labelFontPx(cellPx) { // the size of the rank numbers drawn inside cells this wide (CSS px)
  return Math.min(LABEL_FONT_PX, Math.floor(cellPx * 0.7));
}

function decode(text, Type) {
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
    image: new Image(),
  };
  t.byName = Object.fromEntries(t.rules.map((rule) => [rule.name, rule]));
  t.image.onload = onImage;
  t.image.src = value.image;
  return t;
}

function mapPixel(px, fromSize, toSize) { // the pixel holding the source pixel's centre (analysis.map_pixel)
  return px.map((p) => Math.min(toSize - 1, Math.floor((p + 0.5) * toSize / fromSize)));
}

function format(value, digits = 2) { // a number as the page shows it, "—" for NaN (no neighbour on the grid)
  return Number.isFinite(value) ? value.toFixed(digits) : "—";
}

// -- the table's rows ------------------------------------------------------------------------------------------
function cellOf(px) {
  return [table.row_cell_of_px[px[0]], table.col_cell_of_px[px[1]]];
}

function rowOf(cell) { // the table row of a query cell, or -1 when the table does not hold it
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
function frame(cssWidth) {
  const pad = table.padding;
  const top = -table.row_edges_px[0];
  const left = -table.col_edges_px[0];
  const spanY = table.row_edges_px[table.row_edges_px.length - 1] + top;
  const spanX = table.col_edges_px[table.col_edges_px.length - 1] + left;
  const scale = cssWidth / Math.max(spanX, spanY);
  return {pad, top, left, scale, width: spanX * scale, height: spanY * scale};
}

function rect(f, cell) { // a cell's rectangle in the panel's CSS pixels
  const r = cell[0] + f.pad;
  const c = cell[1] + f.pad;
  const y0 = (table.row_edges_px[r] + f.top) * f.scale;
  const x0 = (table.col_edges_px[c] + f.left) * f.scale;
  const y1 = (table.row_edges_px[r + 1] + f.top) * f.scale;
  const x1 = (table.col_edges_px[c + 1] + f.left) * f.scale;
  return {x: x0, y: y0, w: x1 - x0, h: y1 - y0};
}

function cellAt(f, x, y) { // CSS position → the cell [row, col] under it, padding cells included, or null
  const find = (edges, at) => {
    for (let i = 0; i + 1 < edges.length; i++) if (edges[i] <= at && at < edges[i + 1]) return i - f.pad;
    return null;
  };
  const row = find(table.row_edges_px, y / f.scale - f.top);
  const col = find(table.col_edges_px, x / f.scale - f.left);
  return row === null || col === null ? null : [row, col];
}

function pixelAt(f, x, y) { // CSS position → the model-input pixel [row, col] nearest to it: a position in the
  // padding frame snaps to the image's edge, so that its cell is the query cell nearest to the position
  const nearest = (at) => Math.min(Math.max(Math.floor(at), 0), table.input_size - 1);
  return [nearest(y / f.scale - f.top), nearest(x / f.scale - f.left)];
}

// -- drawing ----------------------------------------------------------------------------------------------------
function sized(target, cssWidth) {
  const f = frame(cssWidth);
  const ratio = window.devicePixelRatio || 1;
  target.style.width = `${f.width}px`;
  target.style.height = `${f.height}px`;
  target.width = Math.round(f.width * ratio);
  target.height = Math.round(f.height * ratio);
  const ctx = target.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return [ctx, f];
}

function drawPanel(target, cssWidth, selection, row, options) {
  const [ctx, f] = sized(target, cssWidth);
  f.ranks = "none"; // how the rank numbers were drawn: "inside:N" (in N cells), "chips:N", or not at all
  ctx.fillStyle = "#3a3a3a"; // padding cells around the image (darker than a letterbox's grey bars)
  ctx.fillRect(0, 0, f.width, f.height);
  ctx.imageSmoothingEnabled = false;
  if (table.image.complete) {
    ctx.drawImage(table.image, f.left * f.scale, f.top * f.scale, table.input_size * f.scale,
                  table.input_size * f.scale);
  }
  const cell = cellOf(query);
  const q = rect(f, cell);
  const qx = q.x + q.w / 2;
  const qy = q.y + q.h / 2;
  ctx.strokeStyle = table.candidate_color;
  ctx.lineWidth = 1;
  for (const c of candidates(selection)) {
    const r = rect(f, c);
    ctx.strokeRect(r.x + 0.5, r.y + 0.5, r.w - 1, r.h - 1);
  }
  if (row < 0) return f;
  const list = neighbors(selection, row).filter((n) => n.cell);
  const fontPx = labelFontPx(q.w);
  const small = fontPx < LABEL_MIN_FONT_PX;
  if (small && options.lines) {
    ctx.lineWidth = 1.5;
    for (const n of list) {
      const r = rect(f, n.cell);
      ctx.strokeStyle = table.colors[n.rank];
      ctx.beginPath();
      ctx.moveTo(qx, qy);
      ctx.lineTo(r.x + r.w / 2, r.y + r.h / 2);
      ctx.stroke();
    }
  }
  ctx.lineWidth = Math.max(1.5, Math.min(3, q.w / 6));
  for (const n of [...list].reverse()) { // rank 0 drawn last, on top
    const r = rect(f, n.cell);
    ctx.strokeStyle = table.colors[n.rank];
    ctx.strokeRect(r.x + ctx.lineWidth / 2, r.y + ctx.lineWidth / 2, r.w - ctx.lineWidth, r.h - ctx.lineWidth);
  }
  ctx.lineWidth = 2;
  ctx.strokeStyle = "#000";
  ctx.strokeRect(q.x - 1, q.y - 1, q.w + 2, q.h + 2);
  ctx.strokeStyle = "#fff";
  ctx.strokeRect(q.x - 3, q.y - 3, q.w + 6, q.h + 6);
  if (options.labels && selection.k <= table.max_labelled_ranks) {
    const drawn = drawRanks(ctx, f, list, small ? LABEL_FONT_PX : fontPx, small);
    f.ranks = `${small ? "chips" : "inside"}:${drawn}`;
  }
  return f;
}

function drawRanks(ctx, f, list, fontPx, small) { // returns how many numbers it drew
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  ctx.font = `600 ${fontPx}px system-ui, sans-serif`;
  const placed = [];
  let drawn = 0;
  for (const n of list) {
    const r = rect(f, n.cell);
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

