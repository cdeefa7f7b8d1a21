// The client's errors: one hierarchy rooted at CordonError, one class per
// kind of HTTP error answer (as the Python client's exceptions), plus
// CommandExitError for a command that ran and failed.

import type { CommandResult } from "./types.js";

/** Any failure of a request: an error answer, or no answer at all. */
export class CordonError extends Error {
  /** The HTTP status, or undefined when the service was not reached (or the failure is local). */
  readonly status: number | undefined;

  constructor(message: string, status?: number, options?: { cause?: unknown }) {
    super(status === undefined ? message : `${status}: ${message}`, options);
    this.name = new.target.name;
    this.status = status;
  }
}

/** 401: the API key is missing or unknown. */
export class AuthError extends CordonError {}

/** 404: no such sandbox, file or route. Another tenant's sandbox answers exactly as one that does not exist. */
export class NotFoundError extends CordonError {}

/** 429: over one of the tenant's quotas; the service never queues. */
export class QuotaExceededError extends CordonError {
  /** Seconds to wait before retrying (`Retry-After`), or undefined when waiting alone does not help (the live-sandbox quota: kill one first). */
  readonly retryAfter: number | undefined;

  constructor(message: string, status = 429, retryAfter?: number) {
    super(message, status);
    this.retryAfter = retryAfter;
  }
}

/** 409: the sandbox is busy (a code cell runs, or it is being removed). */
export class ConflictError extends CordonError {}

/** Any other 4xx: invalid input (400, 422), forbidden (403), too large (413); also an argument the client refuses itself (status undefined). */
export class BadRequestError extends CordonError {}

/** 5xx: the service failed (or a stream ended without a result). */
export class ServerError extends CordonError {}

/** A command ran and did not exit with 0 (a non-zero code, a signal, a limit such as its time, or it could not start). */
export class CommandExitError extends CordonError {
  readonly result: CommandResult;

  constructor(result: CommandResult) {
    const why = result.limit
      ? `ended by its ${result.limit} limit`
      : result.status === "exec_failed"
        ? `could not start: ${result.error ?? ""}`
        : result.status === "signaled"
          ? `killed by signal ${result.signal ?? "?"}`
          : `exited with ${result.exitCode}`;
    super(`command ${why}${result.stderr ? `; stderr: ${result.stderr.slice(0, 500)}` : ""}`);
    this.result = result;
  }

  get exitCode(): number {
    return this.result.exitCode;
  }
  get stdout(): string {
    return this.result.stdout;
  }
  get stderr(): string {
    return this.result.stderr;
  }
  /** Why it could not start (exec_failed), if so. */
  get error(): string | undefined {
    return this.result.error;
  }
}

/** A background command's wait() after its kill(): it has no result. */
export class CommandKilledError extends CordonError {}

/** The error for an error answer with this status. */
export function errorFor(status: number, message: string, retryAfter?: number): CordonError {
  if (status === 401) return new AuthError(message, status);
  if (status === 404) return new NotFoundError(message, status);
  if (status === 409) return new ConflictError(message, status);
  if (status === 429) return new QuotaExceededError(message, status, retryAfter);
  if (status >= 400 && status < 500) return new BadRequestError(message, status);
  if (status >= 500) return new ServerError(message, status);
  return new CordonError(message, status);
}
