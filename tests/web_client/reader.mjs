// The AI SDK's own client pieces against threadline.web: DefaultChatTransport posts
// and reconnects, readUIMessageStream rebuilds the UI message from the chunks.
//
//   node reader.mjs URL USER send CHAT TEXT [STOP_AFTER_DELTAS]
//   node reader.mjs URL USER resume CHAT
//
// Prints one JSON line: {"message": <the last UI message state>, "deltas": n}, or
// {"message": null} when the server has no stream to resume (204).
import { DefaultChatTransport, readUIMessageStream } from "ai";

const [url, user, command, chatId, text, stopAfter] = process.argv.slice(2);
const transport = new DefaultChatTransport({ api: `${url}/chat`, headers: { "x-user": user } });
const abort = new AbortController();

let stream;
if (command === "send") {
  stream = await transport.sendMessages({
    chatId,
    trigger: "submit-message",
    messageId: undefined,
    abortSignal: abort.signal,
    messages: [{ id: "u-" + Date.now(), role: "user", parts: [{ type: "text", text }] }],
  });
} else {
  stream = await transport.reconnectToStream({ chatId, abortSignal: abort.signal });
}
if (stream === null) {
  console.log(JSON.stringify({ message: null }));
  process.exit(0);
}

let deltas = 0;
const counted = stream.pipeThrough(new TransformStream({
  transform(chunk, controller) {
    controller.enqueue(chunk);
    if (chunk.type === "text-delta") deltas += 1;
  },
}));
let last = null;
try {
  for await (const message of readUIMessageStream({ stream: counted, terminateOnError: true })) {
    last = message;
    if (stopAfter && deltas >= Number(stopAfter)) {
      abort.abort();  // the client goes away mid-answer
      break;
    }
  }
} catch (error) {
  if (!abort.signal.aborted) throw error;
}
console.log(JSON.stringify({ message: last, deltas }));
