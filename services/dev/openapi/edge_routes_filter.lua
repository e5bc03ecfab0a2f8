-- The edge's routes filter (envoy.filters.http.lua, deploy/envoy/envoy.yaml), for JSON
-- requests only (native gRPC passes): a preflight (OPTIONS with origin and
-- access-control-request-method) is answered 204; a path of a JSON route asked with a
-- method it does not take is answered 405 METHOD_NOT_ALLOWED with `allow`; a JSON body
-- holding a field its message does not have (the transcoder would drop it silently), a
-- 32-bit integer field a value that is no integer of its range (the transcoder's answer
-- names the field only in its message), or a value in a form the OpenAPI document does
-- not give it though the transcoder would take it (null, an enum's number, a 64-bit
-- integer as a number, a 32-bit one or a float as a string), is answered 400
-- MALFORMED_JSON with a field violation naming it as the body spelt it; a query parameter
-- naming an enum value by its number is answered 400 INVALID_QUERY_PARAMETER. Bodies it
-- cannot read as JSON, and other wrong types, are left to the transcoder's own answers.
-- A stream's answer
-- (WatchJob, WatchJobs: one JSON object per line) says so: application/x-ndjson.

local MAX_DEPTH = 64
local ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
local BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
local UNKNOWN_FIELD = "no such field in the request body"
-- What an "int32" / "uint32" node takes, as the violation says it.
local INTEGER_RANGES = {
  int32 = {-2147483648, 2147483647, "must be an integer from -2147483648 to 2147483647"},
  uint32 = {0, 4294967295, "must be an integer from 0 to 4294967295"},
}

local function quote(text)
  return '"' .. text:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' end
    if c == "\\" then return "\\\\" end
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

-- JSON as far as the check needs it: objects as {keys, values}, arrays as {items},
-- numbers as {number = literal}, strings as {text = text}, true and false as {bool =
-- true}, null as {null = true}, anything else as true. nil when the text is not JSON (or
-- nests too deep).
local parse_value

local function skip(text, i)
  return text:find("[^ \t\r\n]", i) or #text + 1
end

local function parse_string(text, i)
  -- text:sub(i, i) is the opening quote
  local parts = {}
  local j = i + 1
  while true do
    local stop = text:find('["\\]', j)
    if not stop then return nil end
    parts[#parts + 1] = text:sub(j, stop - 1)
    if text:sub(stop, stop) == '"' then
      return table.concat(parts), stop + 1
    end
    local escaped = text:sub(stop + 1, stop + 1)
    if escaped == "u" then
      local hex = text:sub(stop + 2, stop + 5)
      if not hex:match("^%x%x%x%x$") then return nil end
      local code = tonumber(hex, 16)
      parts[#parts + 1] = code < 128 and string.char(code) or ("\\u" .. hex)
      j = stop + 6
    else
      local plain = ({['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f",
                      n = "\n", r = "\r", t = "\t"})[escaped]
      if not plain then return nil end
      parts[#parts + 1] = plain
      j = stop + 2
    end
  end
end

parse_value = function(text, i, depth)
  if depth > MAX_DEPTH then return nil end
  i = skip(text, i)
  local c = text:sub(i, i)
  if c == "{" then
    local object = {keys = {}, values = {}}
    i = skip(text, i + 1)
    if text:sub(i, i) == "}" then return object, i + 1 end
    while true do
      if text:sub(i, i) ~= '"' then return nil end
      local key
      key, i = parse_string(text, i)
      if not key then return nil end
      i = skip(text, i)
      if text:sub(i, i) ~= ":" then return nil end
      local value
      value, i = parse_value(text, i + 1, depth + 1)
      if value == nil then return nil end
      object.keys[#object.keys + 1] = key
      object.values[#object.values + 1] = value
      i = skip(text, i)
      local sep = text:sub(i, i)
      if sep == "}" then return object, i + 1 end
      if sep ~= "," then return nil end
      i = skip(text, i + 1)
    end
  elseif c == "[" then
    local array = {items = {}}
    i = skip(text, i + 1)
    if text:sub(i, i) == "]" then return array, i + 1 end
    while true do
      local value
      value, i = parse_value(text, i, depth + 1)
      if value == nil then return nil end
      array.items[#array.items + 1] = value
      i = skip(text, i)
      local sep = text:sub(i, i)
      if sep == "]" then return array, i + 1 end
      if sep ~= "," then return nil end
      i = i + 1
    end
  elseif c == '"' then
    local text_value, after = parse_string(text, i)
    if not text_value then return nil end
    return {text = text_value}, after
  else
    local literal = text:match("^[%w%.%+%-]+", i)
    if not literal then return nil end
    if literal:find("^[%-%d]") then return {number = literal}, i + #literal end
    if literal == "true" or literal == "false" then return {bool = true}, i + #literal end
    if literal == "null" then return {null = true}, i + #literal end
    return true, i + #literal
  end
end

-- The path of the first value in `value` that `node` refuses and why, or nil.
local check

-- The JSON a `{kind = k}` node takes (a value's kind: its key in parse_value's tables),
-- and how a violation says so.
local TAKES = {
  string = {text = true}, enum = {text = true}, int64 = {text = true},
  bool = {bool = true}, number = {number = true},
}
local MUST = {
  string = "must be a JSON string",
  enum = "must be the enum value's name (a JSON string), not its number",
  int64 = "must be a JSON string of digits (a 64-bit integer)",
  bool = "must be true or false",
  number = "must be a JSON number",
}
local NULL = "must not be null: leave the field out for its default"

local function check_kind(kind, value, path)
  -- An object is the transcoder's to refuse.
  if value.keys then return nil end
  for taken in pairs(TAKES[kind]) do
    if value[taken] then return nil end
  end
  return path, MUST[kind]
end

-- A number that is no integer of the node's range; a string or true/false (forms the
-- document does not give) is refused too; an object is the transcoder's to judge.
local function check_integer(node, value, path)
  if value.text or value.bool then return path, MUST.number end
  local number = tonumber(value.number)
  if number == nil then return nil end
  local range = INTEGER_RANGES[node]
  -- NaN is not equal to itself: refused too.
  if number ~= math.floor(number) or number < range[1] or number > range[2] then
    return path, range[3]
  end
  return nil
end

local function check_message(name, value, path)
  local fields = MESSAGES[name]
  if type(value) ~= "table" or not value.keys or not fields then return nil end
  for k, key in ipairs(value.keys) do
    local inner = path == "" and key or (path .. "." .. key)
    local node = fields[key]
    if node == nil then return inner, UNKNOWN_FIELD end
    local found, why = check(node, value.values[k], inner)
    if found then return found, why end
  end
  return nil
end

check = function(node, value, path)
  if node == "*" or type(value) ~= "table" then return nil end
  if value.null then return path, NULL end
  if value.items then
    for k, item in ipairs(value.items) do
      local found, why = check(node, item, path .. "[" .. (k - 1) .. "]")
      if found then return found, why end
    end
    return nil
  end
  if INTEGER_RANGES[node] then return check_integer(node, value, path) end
  if type(node) == "table" and node.kind then return check_kind(node.kind, value, path) end
  if type(node) == "table" then
    if not value.keys then return nil end
    for k, key in ipairs(value.keys) do
      local found, why = check(node.map, value.values[k], path .. "." .. key)
      if found then return found, why end
    end
    return nil
  end
  return check_message(node, value, path)
end

local function unescape(text)
  return (text:gsub("+", " "):gsub("%%(%x%x)", function(hex)
    return string.char(tonumber(hex, 16))
  end))
end

-- The first query parameter of `names` whose value is a number, or nil.
local function enum_number(query, names)
  for key, value in query:gmatch("([^&=]+)=([^&]*)") do
    if names[unescape(key)] and unescape(value):match("^[-+]?%d+$") then
      return unescape(key)
    end
  end
  return nil
end

-- `violation`: {field, description}, a BadRequest field violation.
local function status(request, http_status, code, reason, message, extra_headers, violation)
  local details = '{"@type":"' .. ERROR_INFO .. '","reason":"' .. reason
    .. '","domain":"atelier.dev"}'
  if violation then
    details = details .. ',{"@type":"' .. BAD_REQUEST .. '","fieldViolations":[{"field":'
      .. quote(violation[1]) .. ',"description":' .. quote(violation[2]) .. ',"reason":"'
      .. reason .. '"}]}'
  end
  local headers = {[":status"] = http_status, ["content-type"] = "application/json"}
  for name, value in pairs(extra_headers or {}) do headers[name] = value end
  request:respond(headers, '{"code":' .. code .. ',"message":' .. quote(message)
    .. ',"details":[' .. details .. ']}')
end

local function allowed(methods)
  local names = {}
  for verb in pairs(methods) do names[#names + 1] = verb end
  table.sort(names)
  return table.concat(names, ", ")
end

function envoy_on_request(request)
  local headers = request:headers()
  if (headers:get("content-type") or ""):find("^application/grpc") then return end
  local method = headers:get(":method")
  local path = (headers:get(":path") or ""):gsub("%?.*$", "")
  local route
  for _, each in ipairs(ROUTES) do
    if path:find(each.pattern) then route = each break end
  end
  if method == "OPTIONS" and headers:get("origin") and headers:get("access-control-request-method") then
    request:respond({
      [":status"] = "204",
      ["access-control-allow-methods"] = route and allowed(route.methods) or "GET, POST, DELETE",
      ["access-control-allow-headers"] = headers:get("access-control-request-headers") or "",
      ["access-control-max-age"] = "600",
    }, "")
    return
  end
  if not route then return end
  if route.streams and route.streams[method] then
    request:streamInfo():dynamicMetadata():set("atelier.routes", "stream", true)
  end
  local node = route.methods[method]
  if node == nil then
    status(request, "405", 12, "METHOD_NOT_ALLOWED",
      method .. " is not a method of " .. path .. " (allowed: " .. allowed(route.methods) .. ")",
      {allow = allowed(route.methods)})
    return
  end
  local query = (headers:get(":path") or ""):match("%?(.*)$")
  local enums = route.enums and route.enums[method]
  if query and enums then
    local numbered = enum_number(query, enums)
    if numbered then
      local must = "must be the enum value's name, not its number"
      status(request, "400", 3, "INVALID_QUERY_PARAMETER", quote(numbered) .. " " .. must, nil,
        {numbered, must})
      return
    end
  end
  if not node then return end
  local body = request:body()
  if not body or body:length() == 0 then return end
  local value = parse_value(body:getBytes(0, body:length()), 1, 0)
  if value == nil then return end
  local field, why = check(node, value, "")
  if not field then return end
  local message
  if why == UNKNOWN_FIELD then
    message = "unknown field " .. quote(field) .. " in the request body"
  else
    message = quote(field) .. " " .. why
  end
  status(request, "400", 3, "MALFORMED_JSON", message, nil, {field, why})
end

function envoy_on_response(response)
  local routes = response:streamInfo():dynamicMetadata():get("atelier.routes")
  if routes == nil or not routes.stream then return end
  local headers = response:headers()
  if headers:get(":status") == "200" and (headers:get("content-type") or ""):find("^application/json") then
    headers:replace("content-type", "application/x-ndjson")
  end
end
