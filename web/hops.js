// ConvNN Explorer's multi-hop view: the receptive field of the explorer's query, drawn in the page.
//
// Run by Gradio's gr.HTML as the body of js_on_load(element, trigger, props, server, upload, watch). The server
// sends, per (model, image, layer, hops, head), the first hop reaching each model-input pixel for every query cell
// of the layer (analysis/rendering/page.py: page_hops). The explorer announces each new query with a "cx-query"
// event on the document (web/explorer.js); this view then only looks the query's row up and redraws. Where every
// query's field would be too large a table (a large layer on a large input), the server sends the fields of the
// queries listed in `queries`, and for a query not among them this view asks for its field (trigger("select")).

const MAX_PX = 420; // the panel's largest CSS width
const ASK_AGAIN_MS = 100; // after an answer for another query than the one asked for last, ask again this late

const root = element.querySelector(".cx-hops");
root.innerHTML = `<canvas class="cx-hop-canvas" aria-label="receptive field of the query"></canvas>
  <div class="cx-legend"></div><div class="cx-counts"></div>`;
const canvas = root.querySelector("canvas");
let field = null;
let query = null;
let drawCount = 0;
let asked = null; // the query cell whose field was asked for and has not arrived yet

function decode(text, Type) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return new Type(bytes.buffer);
}

function currentQuery() { // the explorer's query, as its root element states it
  const explorer = document.querySelector(".cx[data-query]");
  return explorer ? explorer.dataset.query.split(",").map(Number) : null;
}

function draw() {
  if (!field || !query || query[0] >= field.input_size || query[1] >= field.input_size) return;
  const size = field.input_size;
  const cell = [field.row_cell_of_px[query[0]], field.col_cell_of_px[query[1]]];
  const raster = cell[0] * field.grid[1] + cell[1];
  const row = field.queries ? field.queries.indexOf(raster) : raster; // the query's row of the table
  if (row < 0) { // not in the table: ask the server for this query's field, once
    if (asked !== raster) {
      asked = raster;
      root.dataset.asked = String(raster);
      trigger("select", {index: [...query], value: null});
    }
    return;
  }
  const css = Math.max(160, Math.min(MAX_PX, root.clientWidth || MAX_PX));
  const ratio = window.devicePixelRatio || 1;
  canvas.style.width = canvas.style.height = `${css}px`;
  canvas.width = canvas.height = Math.round(css * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.imageSmoothingEnabled = false;
  const scale = css / size;
  if (field.picture.complete) ctx.drawImage(field.picture, 0, 0, css, css);
  ctx.fillStyle = "rgba(0, 0, 0, 0.45)"; // what no hop reaches is dimmed
  ctx.fillRect(0, 0, css, css);
  const offset = row * size * size;
  for (let hop = field.colors.length - 1; hop >= 0; hop--) {
    ctx.fillStyle = field.colors[hop];
    ctx.globalAlpha = hop === 0 ? 0.9 : 0.55;
    for (let y = 0; y < size; y++) {
      for (let x = 0; x < size; x++) {
        if (field.hops[offset + y * size + x] === hop) ctx.fillRect(x * scale, y * scale, scale, scale);
      }
    }
  }
  ctx.globalAlpha = 1;
  ctx.strokeStyle = "#fff";
  ctx.lineWidth = 2;
  ctx.strokeRect(query[1] * scale - 2, query[0] * scale - 2, scale + 4, scale + 4);
  const counts = field.pixel_counts.slice(row * field.colors.length, (row + 1) * field.colors.length);
  root.querySelector(".cx-legend").replaceChildren(...["query", ...field.layers].map((name, hop) => {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = field.colors[hop];
    item.append(swatch, `hop ${hop}: ${name}`);
    return item;
  }));
  root.querySelector(".cx-counts").textContent =
    `pixels reached from pixel (${query[0]}, ${query[1]}): ` +
    Array.from(counts, (n, hop) => `hop ${hop}: ${n} px`).join(", ");
  drawCount += 1;
  root.dataset.query = query.join(",");
  root.dataset.counts = Array.from(counts).join(",");
  root.dataset.drawn = String(drawCount);
}

function show() {
  const value = props.value;
  if (!value || typeof value !== "object" || !value.hops) return;
  field = {...value, hops: decode(value.hops, Int8Array), pixel_counts: decode(value.pixel_counts, Int32Array),
           picture: new Image()};
  if (asked !== null && field.queries && !field.queries.includes(asked)) {
    // the answer to an earlier click, while a later one's was asked for: Gradio dropped that trigger (it came while
    // this event was on its way), so ask again once this one has finished (`asked` holds the draw below back)
    setTimeout(() => { asked = null; draw(); }, ASK_AGAIN_MS);
  } else {
    asked = null;
  }
  field.picture.onload = () => draw();
  field.picture.src = value.image;
  query = currentQuery() || query;
  draw();
}

document.addEventListener("cx-query", (event) => { query = event.detail.px; draw(); });
new ResizeObserver(() => draw()).observe(root);
watch("value", show);
show();
